"""The agents' settings from the environment (``trainingrun sync`` / ``trainingrun restore``).

Covers: a missing or malformed variable (storage URI missing, not s3://, without a bucket; part
size below 5 MiB, not a number, not finite; concurrency, keep, quiet and drain periods, bandwidth
and nice out of range; checkpoint folder missing; restore step missing or not a plain step
number; a size limit that is not a byte quantity) makes the command exit 2 before touching the
network, with a message on stderr that names the variable; all through ``cli.main`` with the
process environment. The restore gets ``TRAININGRUN_SIZE_LIMIT`` in bytes, and no limit without
it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trainingrun import cli
from trainingrun.agent import restore

COMMON_CASES = [
    pytest.param(
        {"TRAININGRUN_STORAGE_URI": ""}, "TRAININGRUN_STORAGE_URI is not set", id="no-uri"
    ),
    pytest.param(
        {"TRAININGRUN_STORAGE_URI": "hdfs://bucket/x"},
        "TRAININGRUN_STORAGE_URI: storage uri 'hdfs://bucket/x' must start with s3://, gs:// or az://",
        id="uri-unknown-scheme",
    ),
    pytest.param(
        {"TRAININGRUN_STORAGE_URI": "s3:///runs"},
        "TRAININGRUN_STORAGE_URI: storage uri 's3:///runs' has no bucket",
        id="uri-without-bucket",
    ),
    pytest.param(
        {"TRAININGRUN_PART_SIZE_MB": "1"},
        "TRAININGRUN_PART_SIZE_MB='1' must be at least 5",
        id="part-size-below-s3-minimum",
    ),
    pytest.param(
        {"TRAININGRUN_PART_SIZE_MB": "16MiB"},
        "TRAININGRUN_PART_SIZE_MB='16MiB' is not a number",
        id="part-size-with-unit",
    ),
    pytest.param(
        {"TRAININGRUN_PART_SIZE_MB": "nan"},
        "TRAININGRUN_PART_SIZE_MB='nan' is not a finite number",
        id="part-nan",
    ),
    pytest.param(
        {"TRAININGRUN_PART_SIZE_MB": "inf"},
        "TRAININGRUN_PART_SIZE_MB='inf' is not a finite number",
        id="part-inf",
    ),
    pytest.param(
        {"TRAININGRUN_CONCURRENCY": "0"},
        "TRAININGRUN_CONCURRENCY='0' must be at least 1",
        id="concurrency-zero",
    ),
    pytest.param(
        {"TRAININGRUN_MAX_BANDWIDTH_MBPS": "fast"},
        "TRAININGRUN_MAX_BANDWIDTH_MBPS='fast' is not a number",
        id="bandwidth-not-a-number",
    ),
    pytest.param(
        {"TRAININGRUN_MAX_BANDWIDTH_MBPS": "0.01"},
        "TRAININGRUN_MAX_BANDWIDTH_MBPS='0.01' must be at least 0.1",
        id="bandwidth-too-low",
    ),
    pytest.param(
        {"TRAININGRUN_CHECKPOINT_DIR": ""},
        "TRAININGRUN_CHECKPOINT_DIR is not set",
        id="no-checkpoint-dir",
    ),
]
SYNC_CASES = [
    pytest.param(
        {"TRAININGRUN_CHECKPOINT_FORMAT": "keras"},
        "TRAININGRUN_CHECKPOINT_FORMAT='keras' is not one of auto, hf, nemo",
        id="format-unknown",
    ),
    pytest.param(
        {"TRAININGRUN_CHECKPOINT_FORMAT": "pattern"},
        "TRAININGRUN_CHECKPOINT_PATTERN must be JSON",
        id="pattern-missing",
    ),
    pytest.param(
        {"TRAININGRUN_CHECKPOINT_FORMAT": "pattern", "TRAININGRUN_CHECKPOINT_PATTERN": '{"x": 1}'},
        "TRAININGRUN_CHECKPOINT_PATTERN must be JSON",
        id="pattern-no-glob",
    ),
    pytest.param(
        {
            "TRAININGRUN_CHECKPOINT_FORMAT": "pattern",
            "TRAININGRUN_CHECKPOINT_PATTERN": '{"glob": "s_*", "step": "\\\\d+"}',
        },
        "needs a group",
        id="pattern-step-without-group",
    ),
    pytest.param({"TRAININGRUN_KEEP": "0"}, "TRAININGRUN_KEEP='0' must be at least 1", id="keep-0"),
    pytest.param(
        {"TRAININGRUN_KEEP": "nan"}, "TRAININGRUN_KEEP='nan' is not a finite number", id="keep-nan"
    ),
    pytest.param(
        {"TRAININGRUN_QUIET_SECONDS": "-1"},
        "TRAININGRUN_QUIET_SECONDS='-1' must be at least 0",
        id="quiet-negative",
    ),
    pytest.param(
        {"TRAININGRUN_DRAIN_SECONDS": "1m"},
        "TRAININGRUN_DRAIN_SECONDS='1m' is not a number",
        id="drain-with-unit",
    ),
    pytest.param(
        {"TRAININGRUN_SYNC_NICE": "low"},
        "TRAININGRUN_SYNC_NICE='low' is not a number",
        id="nice-not-a-number",
    ),
]
RESTORE_CASES = [
    pytest.param(
        {"TRAININGRUN_RESTORE_STEP": ""}, "TRAININGRUN_RESTORE_STEP is not set", id="no-step"
    ),
    *(
        pytest.param(
            {"TRAININGRUN_RESTORE_STEP": raw},
            f"TRAININGRUN_RESTORE_STEP={raw!r} is not a step number",
            id=f"step-{name}",
        )
        for name, raw in [
            ("word", "latest"),
            ("negative", "-1"),
            ("fraction", "1.5"),
            ("superscript-digit", "\u00b2"),
            ("space", "1 2"),
        ]
    ),
    *(
        pytest.param(
            {"TRAININGRUN_SIZE_LIMIT": raw},
            f"TRAININGRUN_SIZE_LIMIT: {raw!r} is not a quantity",
            id=f"size-limit-{name}",
        )
        for name, raw in [("word", "lots"), ("unit-bytes", "50GiB"), ("milli", "500m")]
    ),
]


@pytest.mark.parametrize("command", ["sync", "restore"])
@pytest.mark.parametrize(("overrides", "message"), COMMON_CASES)
def test_common_settings_errors_exit_2(
    run_agent: Callable[[str, dict[str, str]], int],
    command: str,
    overrides: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_agent(command, overrides) == 2

    err = capsys.readouterr().err
    assert err.startswith(f"trainingrun {command}: ")
    assert message in err


@pytest.mark.parametrize(("overrides", "message"), SYNC_CASES)
def test_sync_settings_errors_exit_2(
    run_agent: Callable[[str, dict[str, str]], int],
    overrides: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_agent("sync", overrides) == 2

    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "message"), RESTORE_CASES)
def test_restore_settings_errors_exit_2(
    run_agent: Callable[[str, dict[str, str]], int],
    overrides: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_agent("restore", overrides) == 2

    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "unset", "set_", "message"),
    [
        pytest.param("sync", "TRAININGRUN_STORAGE_URI", {}, "TRAININGRUN_STORAGE_URI", id="sync"),
        pytest.param(
            "restore",
            "TRAININGRUN_RESTORE_STEP",
            {"TRAININGRUN_STORAGE_URI": "s3://b/p", "TRAININGRUN_CHECKPOINT_DIR": "/c"},
            "TRAININGRUN_RESTORE_STEP is not set",
            id="restore",
        ),
        pytest.param(
            "restore",
            "TRAININGRUN_STORAGE_URI",
            {"TRAININGRUN_PART_SIZE_MB": "1"},
            "TRAININGRUN_STORAGE_URI",
            id="restore-uri-checked-first",
        ),
    ],
)
def test_main_reads_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    unset: str,
    set_: dict[str, str],
    message: str,
) -> None:
    monkeypatch.delenv(unset, raising=False)
    for name, value in set_.items():
        monkeypatch.setenv(name, value)

    assert cli.main([command]) == 2

    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "limit"),
    [
        pytest.param({}, None, id="no-limit"),
        pytest.param({"TRAININGRUN_SIZE_LIMIT": "50Gi"}, 50 << 30, id="gibibytes"),
        pytest.param({"TRAININGRUN_SIZE_LIMIT": "1.5G"}, 1_500_000_000, id="decimal-giga"),
    ],
)
def test_restore_gets_the_size_limit_in_bytes(
    run_agent: Callable[[str, dict[str, str]], int],
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, str],
    limit: int | None,
) -> None:
    seen: list[restore.RestoreSettings] = []

    def main(store: object, settings: restore.RestoreSettings, metrics: object) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(restore, "main", main)

    assert run_agent("restore", {"TRAININGRUN_METRICS_PORT": "0", **overrides}) == 0

    assert [s.size_limit for s in seen] == [limit]
