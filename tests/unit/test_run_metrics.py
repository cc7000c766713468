"""The per-run metrics (``RunCollector``) and the leader flag, on a private registry.

Covers: every per-run series of a run whose status has every field, with its value (24 series:
the count docs/operations.md gives), also from the status as the API's models write it; a
status without progress, checkpoint or goodput exports only what it has; malformed figures
(text, NaN, a bad time) export nothing rather than raise; the goodput ratio from ``percent``
when ``ratio`` is absent; the ETA counts down from the
progress observation; a finished run stays ``keep_finished_seconds`` after it ended, then drops
out, and with 0 only unfinished runs are exported; an unknown phase is one label value; the
collector reads the runs at each scrape (nothing kept between); the leader flag is 0 until
``leading()``; the settings and their refusals.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.chart.monitoring import full_run
from trainingrun.api import (
    CheckpointRef,
    Condition,
    Goodput,
    RestartPolicySpec,
    RunProgress,
    StepsLost,
    TrainingRunStatus,
)
from trainingrun.operator.metrics import LeaderFlag, OperatorMetrics
from trainingrun.operator.settings import ConfigurationError, OperatorSettings

# A minute after the full run's progress and goodput were observed.
NOW = datetime(2026, 11, 29, 10, 6, 0, tzinfo=UTC).timestamp()
WHERE = {"namespace": "team-a", "run": "llm-7b"}
STARTED = "2026-11-29T09:00:00Z"


def registry_of(runs: list[dict[str, Any]], keep: float = 3600, now: float = NOW) -> Any:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.export_runs_with(lambda: runs, keep, clock=lambda: now)
    return registry


def run_series(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every per-run sample, by name and labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("trainingrun_run_")
    }


def value(registry: Any, name: str, **labels: str) -> float | None:
    got: float | None = registry.get_sample_value(name, {**WHERE, **labels})
    return got


def test_a_run_with_every_field_exports_24_series_with_their_values() -> None:
    registry = registry_of([full_run()])

    series = run_series(registry)
    started = datetime(2026, 11, 29, 9, tzinfo=UTC).timestamp()
    committed = datetime(2026, 11, 29, 10, 0, 0, 250000, tzinfo=UTC).timestamp()
    expected: list[tuple[str, dict[str, str], float]] = [
        ("trainingrun_run_info", {"phase": "Running"}, 1),
        ("trainingrun_run_progress_step", {}, 480),
        ("trainingrun_run_progress_total_steps", {}, 1000),
        ("trainingrun_run_progress_ratio", {}, 0.48),
        ("trainingrun_run_progress_steps_per_second", {}, 2.5),
        ("trainingrun_run_eta_seconds", {}, 208 - 60),
        ("trainingrun_run_attempt_start_timestamp_seconds", {}, started),
        ("trainingrun_run_last_commit_timestamp_seconds", {}, committed),
        ("trainingrun_run_checkpoint_step", {}, 400),
        ("trainingrun_run_restarts_total", {}, 1),
        ("trainingrun_run_restart_budget", {}, 5),
        ("trainingrun_run_preemptions_total", {}, 2),
        ("trainingrun_run_goodput_ratio", {}, 0.8333),
        ("trainingrun_run_wall_seconds_total", {}, 7200),
        ("trainingrun_run_seconds_total", {"kind": "productive"}, 6000),
        ("trainingrun_run_seconds_total", {"kind": "lost"}, 300),
        ("trainingrun_run_seconds_total", {"kind": "startup"}, 400),
        ("trainingrun_run_seconds_total", {"kind": "waiting"}, 450),
        ("trainingrun_run_seconds_total", {"kind": "stall"}, 50),
        ("trainingrun_run_steps_lost_total", {"preemption": "eviction"}, 10),
        ("trainingrun_run_steps_lost_total", {"preemption": "notice"}, 0),
        ("trainingrun_run_steps_lost_total", {"preemption": "node_lost"}, 5),
        ("trainingrun_run_steps_lost_total", {"preemption": "sigkill"}, 3),
        ("trainingrun_run_steps_lost_total", {"preemption": "other"}, 1),
    ]
    assert series == {
        (name, tuple(sorted({**WHERE, **labels}.items()))): v for name, labels, v in expected
    }
    assert len(series) == 24


def test_the_status_the_api_writes_exports_every_series() -> None:
    """The status as the operator writes it (the API's models, dumped as in the object), not a
    hand-written dict: a field renamed in the API would drop its series here."""
    status = TrainingRunStatus(
        phase="Running",
        restarts=1,
        preemptions=2,
        conditions=[
            Condition(type="Running", status="True", reason="Resumed", last_transition_time=STARTED)
        ],
        latest_checkpoint=CheckpointRef(step=400, uri="s3://b/x", time="2026-11-29T10:00:00Z"),
        progress=RunProgress(
            step=480,
            total_steps=1000,
            percent=48.0,
            steps_per_second=2.5,
            eta_seconds=208,
            summary="48%",
            attempt=3,
            observed_at="2026-11-29T10:05:00Z",
        ),
        goodput=Goodput(
            wall_seconds=7200,
            productive_seconds=6000,
            percent=83.3,
            steps_lost=StepsLost(eviction=10, node_lost=5),
            observed_at="2026-11-29T10:05:00Z",
        ),
    )
    spec = {"restartPolicy": RestartPolicySpec(max_restarts=5).model_dump(by_alias=True)}
    run = {
        "metadata": {"namespace": "team-a", "name": "llm-7b"},
        "spec": spec,
        "status": status.model_dump(by_alias=True, mode="json"),
    }
    registry = registry_of([run])

    assert len(run_series(registry)) == 24
    assert value(registry, "trainingrun_run_goodput_ratio") == pytest.approx(0.833)
    assert value(registry, "trainingrun_run_steps_lost_total", preemption="node_lost") == 5
    assert value(registry, "trainingrun_run_restart_budget") == 5


def test_a_new_run_exports_its_phase_counts_and_budget_only() -> None:
    run = {"metadata": {"namespace": "team-a", "name": "llm-7b"}, "spec": {}, "status": {}}
    series = run_series(registry_of([run]))

    assert {name for name, _ in series} == {
        "trainingrun_run_info",
        "trainingrun_run_restarts_total",
        "trainingrun_run_restart_budget",
        "trainingrun_run_preemptions_total",
    }
    registry = registry_of([run])
    assert value(registry, "trainingrun_run_info", phase="Pending") == 1
    assert value(registry, "trainingrun_run_restart_budget") == 3  # the API's default


@pytest.mark.parametrize(
    ("field", "bad", "absent"),
    [
        pytest.param(("progress", "step"), "48", "trainingrun_run_progress_step", id="text-step"),
        pytest.param(
            ("progress", "stepsPerSecond"),
            float("nan"),
            "trainingrun_run_progress_steps_per_second",
            id="nan-rate",
        ),
        pytest.param(
            ("latestCheckpoint", "time"),
            "yesterday",
            "trainingrun_run_last_commit_timestamp_seconds",
            id="bad-time",
        ),
        pytest.param(
            ("latestCheckpoint", "time"),
            "2026-11-29T10:00:00",
            "trainingrun_run_last_commit_timestamp_seconds",
            id="time-without-zone",
        ),
        pytest.param(("goodput", "ratio"), True, "trainingrun_run_goodput_ratio", id="bool"),
    ],
)
def test_a_malformed_figure_exports_nothing_for_it_and_the_rest_as_usual(
    field: tuple[str, str], bad: Any, absent: str
) -> None:
    run = full_run()
    section, key = field
    run["status"][section][key] = bad
    if key == "ratio":
        del run["status"]["goodput"]["percent"]
    registry = registry_of([run])

    assert value(registry, absent) is None
    assert len(run_series(registry)) == 23


def test_goodput_ratio_comes_from_percent_when_there_is_no_ratio() -> None:
    run = full_run()
    del run["status"]["goodput"]["ratio"]
    run["status"]["goodput"]["percent"] = 40.0

    assert value(registry_of([run]), "trainingrun_run_goodput_ratio") == pytest.approx(0.4)


def test_progress_ratio_comes_from_step_and_total_without_percent() -> None:
    run = full_run()
    del run["status"]["progress"]["percent"]
    run["status"]["progress"].update(step=250, totalSteps=1000)

    assert value(registry_of([run]), "trainingrun_run_progress_ratio") == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("seconds_later", "eta"),
    [
        pytest.param(0, 208, id="at-observation"),
        pytest.param(100, 108, id="100s-later"),
        pytest.param(1000, 0, id="past-the-eta-stays-0"),
    ],
)
def test_eta_counts_down_from_the_progress_observation(seconds_later: float, eta: float) -> None:
    observed = datetime(2026, 11, 29, 10, 5, tzinfo=UTC).timestamp()
    registry = registry_of([full_run()], now=observed + seconds_later)

    assert value(registry, "trainingrun_run_eta_seconds") == eta


def finished(run: dict[str, Any], how: str, at: str) -> dict[str, Any]:
    run = copy.deepcopy(run)
    run["status"]["phase"] = how
    run["status"]["conditions"] = [
        {"type": "Running", "status": "False", "lastTransitionTime": at},
        {"type": how, "status": "True", "lastTransitionTime": at},
    ]
    return run


@pytest.mark.parametrize("how", ["Succeeded", "Failed"])
@pytest.mark.parametrize(
    ("ended", "keep", "exported"),
    [
        pytest.param("2026-11-29T09:30:00Z", 3600, True, id="ended-36-min-ago-kept-an-hour"),
        pytest.param("2026-11-29T08:30:00Z", 3600, False, id="ended-96-min-ago-dropped"),
        pytest.param("2026-11-29T10:05:59Z", 0, False, id="keep-0-only-unfinished"),
    ],
)
def test_a_finished_run_drops_out_after_keep_finished_seconds(
    how: str, ended: str, keep: float, exported: bool
) -> None:
    running = full_run(name="still-running")
    registry = registry_of([finished(full_run(), how, ended), running], keep=keep)

    assert (value(registry, "trainingrun_run_info", phase=how) == 1) is exported
    assert registry.get_sample_value(
        "trainingrun_run_info", {"namespace": "team-a", "run": "still-running", "phase": "Running"}
    )


def test_an_unknown_phase_is_one_label_value() -> None:
    run = full_run()
    run["status"]["phase"] = "Whatever-a-status-writer-put-here"

    assert value(registry_of([run]), "trainingrun_run_info", phase="Unknown") == 1


def test_the_runs_are_read_at_every_scrape_and_nothing_is_kept() -> None:
    runs: list[dict[str, Any]] = []
    registry = registry_of(runs)
    assert run_series(registry) == {}

    runs.append(full_run())
    assert value(registry, "trainingrun_run_checkpoint_step") == 400
    runs[0] = copy.deepcopy(runs[0])
    runs[0]["status"]["latestCheckpoint"]["step"] = 500
    assert value(registry, "trainingrun_run_checkpoint_step") == 500
    runs.clear()
    assert run_series(registry) == {}


def test_the_leader_flag_is_0_until_the_replica_leads() -> None:
    registry = CollectorRegistry()
    flag = LeaderFlag(registry)
    assert registry.get_sample_value("trainingrun_operator_leader") == 0

    flag.leading()
    assert registry.get_sample_value("trainingrun_operator_leader") == 1


def test_run_metrics_settings_default_and_from_the_environment() -> None:
    assert OperatorSettings.from_env({}).run_metrics is True
    assert OperatorSettings.from_env({}).run_metrics_keep_finished_seconds == 3600
    settings = OperatorSettings.from_env(
        {
            "TRAININGRUN_RUN_METRICS": "off",
            "TRAININGRUN_RUN_METRICS_KEEP_FINISHED_SECONDS": "0",
        }
    )
    assert (settings.run_metrics, settings.run_metrics_keep_finished_seconds) == (False, 0)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("TRAININGRUN_RUN_METRICS", "yes"),
        ("TRAININGRUN_RUN_METRICS_KEEP_FINISHED_SECONDS", "-1"),
        ("TRAININGRUN_RUN_METRICS_KEEP_FINISHED_SECONDS", "soon"),
    ],
)
def test_run_metrics_settings_refuse_a_bad_value(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        OperatorSettings.from_env({name: raw})
