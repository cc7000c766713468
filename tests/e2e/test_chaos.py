"""The chaos test in its short form (tests/chaos): 2 minutes of every fault at once on a small
fleet with two real trainers, so every change is checked against faults; ``make chaos`` runs
the full size. Passes when no invariant broke and every kind of fault was injected at least
once; the report is printed and kept under the test's tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.faults import KINDS
from tests.chaos.run import Config, run, save

pytestmark = pytest.mark.usefixtures("crd", "session_operator_paused")

SHORT = Config(
    runs=30,
    real=2,
    fault_minutes=2.0,
    mean_gap_s=2.0,
    max_steps=200,
    save_steps=10,
    step_delay=0.4,
    runs_per_node=5,
    real_share=0.2,
    settle_s=30.0,
    finish_timeout_s=420.0,
    kill_until=0.4,
    memory_window_s=20.0,
)


@pytest.mark.timeout(1200)
def test_two_minutes_of_every_fault_break_no_invariant(tmp_path: Path) -> None:
    report = run(SHORT, tmp_path / "work")
    save(report, tmp_path / "chaos-report.json")
    print(json.dumps({k: report[k] for k in ("faults_injected", "checks", "memory")}, indent=1))
    assert report["breaks"] == [], json.dumps(report["breaks"], indent=1)
    assert set(report["faults_injected"]) == set(KINDS), report["faults_missed"]
    assert report["real"] and all(r["phase"] == "Succeeded" for r in report["real"].values())
    assert report["checks"]["resumes checked"] >= 1, "no real trainer resumed from a checkpoint"
