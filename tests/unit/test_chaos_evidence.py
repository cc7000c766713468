"""The chaos run's evidence of a break: the small files of the real trainers' pods only, and
the error of a fault that missed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.evidence import copy_pod_files
from tests.chaos.faults import brief


def test_copies_the_logs_and_pids_of_the_real_trainers_pods_only(tmp_path: Path) -> None:
    state, out = tmp_path / "state", tmp_path / "out"
    out.mkdir()
    real_pod = state / "chaos-1_real3-7"
    other_pod = state / "chaos-1_k0001-2"
    other_ns = state / "chaos-2_real3-1"
    for folder in (real_pod, other_pod, other_ns):
        (folder / "volumes" / "checkpoints").mkdir(parents=True)
        (folder / "trainer.log").write_text("step 44\n")
        (folder / "volumes" / "checkpoints" / "model.safetensors").write_bytes(b"w" * 64)
    (real_pod / "trainer.pid").write_text("4242")
    (real_pod / "restore.termination-log").write_text("verified\n")

    notes = copy_pod_files(state, "chaos-1", ["real3"], out)

    assert notes == []
    kept = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert kept == [
        "real3-7/restore.termination-log",
        "real3-7/trainer.log",
        "real3-7/trainer.pid",
    ]


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        ("short", "short"),
        ("x" * 520, "x" * 520),
        ("start " + "." * 1000 + " address already in use", None),
    ],
)
def test_a_missed_faults_error_keeps_its_start_and_its_end(message: str, kept: str | None) -> None:
    text = brief(message)
    if kept is not None:
        assert text == kept
        return
    assert text.startswith("start ")
    assert text.endswith(" address already in use")
    assert "[...]" in text
    assert len(text) < len(message)
