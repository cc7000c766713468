"""``spec.suspend`` end to end, without Kueue: the operator, the real control plane, SeaweedFS,
and the example HuggingFace fine-tuning script run by local pod runner nodes.

Covers:
- a running example suspended at a random step saves at its next step end (0 steps lost,
  measured against the bucket manifest), its pod goes, and the run shows phase Suspended with
  no pod, attempt moved on, no restart and no preemption counted, and the Events saying who
  suspended it;
- it stays without a pod while suspended; unsuspended, it resumes from the saved step, ends
  Succeeded, and its final weights are bitwise equal to an uninterrupted run's, with the same
  loss at every step after the resume;
- a run created suspended creates no pod until unsuspended;
- the seconds from suspend to no pod, and from unsuspend to the trainer's first step, are
  printed (docs/benchmarks.md).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.example import losses
from tests.e2e.test_full_chain import SEED, Chain, finetune_run
from tests.integration.support import Runs, wait_for
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle

pytestmark = pytest.mark.usefixtures("operator")


def first_step_at(loss_file: Path, timeout: float = 240) -> float:
    """When the trainer logged its first step (polled: the loss file's first line)."""
    wait_for(lambda: losses(loss_file), timeout, f"a first step in {loss_file.name}")
    return time.monotonic()


def gone(runs: Runs, run: str, timeout: float = 60) -> None:
    """Waits until the run has no pod; the timeout names those left, with their phases."""
    left: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [
            f"{p.metadata.name} ({p.status.phase}, deleting: {bool(p.metadata.deletion_timestamp)})"
            for p in runs.pods_of(run)
        ]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"pods of {run} still there after {timeout} s: {left}")


def test_suspend_then_resume_loses_no_step_and_matches_the_uninterrupted_weights(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    s3: Any,
    tmp_path: Path,
    chain_reference: tuple[bytes, dict[int, float]],
) -> None:
    rng = random.Random(SEED)
    chain = Chain(runs, localenv, prefix, "pause", tmp_path, runner_nodes)
    chain.wait_attempt(1)
    chain.wait_step(1, rng.randint(12, 22))

    suspended_at = time.monotonic()
    runs.patch("pause", {"spec": {"suspend": True}})
    status = runs.wait_status(
        "pause", lambda s: s.get("phase") == "Suspended", 120, "the run Suspended"
    )
    gone(runs, "pause")
    gone_s = time.monotonic() - suspended_at
    trained = chain.step(1)
    saved = max(chain.committed(s3))
    assert (status["attempt"], status["restarts"], status["preemptions"]) == (2, 0, 0)
    assert status.get("activePod") is None
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "SuspendRequested")
    assert runs.wait_events("pause", "SuspendRequested")
    assert "spec.suspend" in runs.wait_events("pause", "Paused")[0].message
    assert saved == trained, f"trained to step {trained}, newest committed {saved}"

    time.sleep(3)  # still held: no pod comes back
    assert not runs.pods_of("pause")
    assert runs.status("pause")["phase"] == "Suspended"

    resumed_at = time.monotonic()
    runs.patch("pause", {"spec": {"suspend": False}})
    chain.wait_attempt(2)
    first_s = first_step_at(tmp_path / "loss-2.jsonl") - resumed_at
    assert chain.resume_step(2) == saved
    assert runs.wait_events("pause", "SuspendLifted")

    end = runs.wait_status(
        "pause", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run to end"
    )
    assert end["phase"] == "Succeeded", end
    assert (end["restarts"], end["preemptions"]) == (0, 0)
    chain.assert_matches_reference(s3, chain_reference, 2, saved)
    print(
        f"suspend at step {trained}: saved step {saved} (0 steps lost), pods gone in "
        f"{gone_s:.1f} s; unsuspend to the trainer's first step: {first_s:.1f} s"
    )


def test_a_run_created_suspended_creates_no_pod_until_unsuspended(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    tmp_path: Path,
) -> None:
    body = finetune_run("held", localenv, prefix, tmp_path, [h.node for h in runner_nodes])
    body["spec"]["suspend"] = True
    runs.create(body)

    status = runs.wait_status("held", lambda s: s.get("phase") == "Suspended", 60, "Suspended")
    time.sleep(3)

    assert not runs.pods_of("held")
    assert status["attempt"] == 0
    runs.patch("held", {"spec": {"suspend": False}})
    runs.wait_status("held", lambda s: s.get("activePod") == "held-1", 120, "attempt 1 started")
