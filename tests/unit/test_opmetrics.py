"""OperatorMetrics on a private registry.

Covers: the runs gauge reads the phases at scrape time (every phase exported, zero when no run
is in it, following the runs as they change); transitions counted by Event reason.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from trainingrun.operator.metrics import PHASES, OperatorMetrics


@pytest.mark.parametrize(
    "phases",
    [
        pytest.param([], id="no-runs"),
        pytest.param(["Running", "Running", "Backoff"], id="some-running"),
        pytest.param(list(PHASES) * 3, id="every-phase"),
    ],
)
def test_runs_gauge_counts_phases_at_scrape_time(phases: list[str]) -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    current: list[str] = []
    metrics.count_runs_with(lambda: current)
    current.extend(phases)

    for phase in PHASES:
        got = registry.get_sample_value("trainingrun_runs", {"phase": phase})
        assert got == phases.count(phase), phase


def test_transitions_are_counted_by_reason() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)

    for reason in ("Started", "Preempted", "Resumed", "Preempted"):
        metrics.transitions.labels(reason=reason).inc()

    def count(reason: str) -> float | None:
        return registry.get_sample_value("trainingrun_transitions_total", {"reason": reason})

    assert (count("Started"), count("Preempted"), count("Resumed")) == (1, 2, 1)
    assert count("Failed") is None
