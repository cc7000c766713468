"""The goodput ledger end to end (issue 47): one run of the example fine-tuning
(``examples/finetune.py``, with ``trainingrun.integrations.hf``) on two pod runner nodes,
preempted three ways in a row, each attempt's pod run as real processes:

1. the Eviction API (the trainer saves at the next step end on SIGTERM);
2. a ``spec.preemption.noticeTaints`` taint on its node (the sidecar asks the trainer to save);
3. the trainer process SIGKILLed (exit 137: the steps since the last regular save are lost);

then it trains to the end. Covers:

- per preemption, ``status.attempts[]`` against the trainer's own record (its loss log, a line
  ``{"step": N, "loss": ...}`` per step it trained; its stdout has the Trainer's loss lines,
  which carry no step): ``lastStep`` is the last step the trainer logged, ``committedStep`` the
  step the next attempt's trainer resumed from, ``stepsLost`` their difference, ``kind`` the
  way it was preempted; an eviction and a notice lose no step;
- ``status.goodput``: ``stepsLost`` by kind equal to the sums of the trainer's record,
  ``percent`` equal to 100 * productiveSeconds / wallSeconds within 2 percentage points, the
  five parts adding up to ``wallSeconds`` within 2% of it, ``wallSeconds`` the time the test
  saw the run take;
- the ledger unchanged after the operator restarts and passes over the run again;
- the ledger back, equal, after ``goodput`` and ``attempts`` are removed from the status, twice
  in the life of one operator (it rebuilds them from ``<run prefix>/ledger.json`` in the
  bucket).

The operator here reads progress at the product's default interval (60 s; the session's reads
every second), so the steps lost can only come from the record the sidecar publishes at its end,
read in the pass that ends the attempt. The figures are printed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import paused_session_operators
from tests.e2e.example import losses, pod_spec
from tests.e2e.test_full_chain import node_of, runner_for
from tests.e2e.test_gang import set_taints
from tests.integration.support import OperatorProcess, Runs, evict, trainingrun, wait_for
from tests.localenv import LocalEnv, free_ports
from tests.podrunner import RunnerHandle
from trainingrun import api
from trainingrun.cli import ledger
from trainingrun.cli.runs import table
from trainingrun.decide.goodput import LEDGER_RECORD

MAX_STEPS, SAVE_STEPS, STEP_DELAY = 120, 10, 0.4
# Steps each preempted attempt trains past its resume point before it is preempted: ~10 s.
TRAIN_FOR = 23
NOTICE_TAINT = "example.com/reclaim"  # only this run's spec names it
RUN = "ledger"
PERCENT_POINTS = 2.0  # |percent - 100 * productive / wall|, in percentage points
PARTS_RELATIVE = 0.02  # |sum of the five parts - wall| / wall
PARTS = ("productive", "lost", "startup", "waiting", "stall")
KINDS = ("eviction", "notice", "sigkill")


@pytest.fixture
def ledger_operator(
    localenv: LocalEnv, operator: OperatorProcess, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """An operator that reads progress at the product's default interval, serving metrics; the
    session one (``operator``, asked for so that `make demo`'s is stopped too) pauses
    meanwhile."""
    del operator
    with paused_session_operators():
        proc = OperatorProcess(
            localenv,
            tmp_path / "operator.log",
            extra_env={"TRAININGRUN_PROGRESS_REFRESH_SECONDS": "60"},
            metrics_port=free_ports(1)[0],
        )
        proc.start()
        yield proc
        proc.stop()
        log = proc.log_path.read_text(errors="replace")
        print(f"--- ledger operator log (last 3000 chars) ---\n{log[-3000:]}")


class Trainer:
    """The trainer's own record: the loss log each attempt's trainer writes, a line per step."""

    def __init__(self, loss_dir: Path) -> None:
        self.loss_dir = loss_dir

    def steps(self, attempt: int) -> dict[int, float]:
        return losses(self.loss_dir / f"loss-{attempt}.jsonl")

    def last(self, attempt: int) -> int:
        return max(self.steps(attempt), default=0)

    def resumed(self, attempt: int) -> int:
        """The step the attempt's trainer resumed from: the one before its first."""
        trained = self.steps(attempt)
        return min(trained) - 1 if trained else 0

    def target(self, attempt: int) -> int:
        """A step ``TRAIN_FOR`` or so past the resume point, two to seven past a regular save:
        neither it nor the next step saves, so a stop there is not a regular save."""
        wait_for(lambda: self.steps(attempt), 240, f"attempt {attempt} training")
        step = self.resumed(attempt) + TRAIN_FOR
        return step + (4 - step % SAVE_STEPS) if step % SAVE_STEPS not in range(2, 8) else step

    def wait_step(self, attempt: int, step: int, timeout: float = 240) -> int:
        """Waits until the trainer logged ``step`` and returns the step it logged, polling every
        10 ms: the trainer is then still in the next step, whose end writes its progress."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = self.last(attempt)
            if last >= step:
                return last
            time.sleep(0.01)
        raise AssertionError(f"attempt {attempt} not at step {step} in {timeout}s")


def wait_attempt(runs: Runs, attempt: int, timeout: float = 180) -> dict[str, Any]:
    return runs.wait_status(
        RUN,
        lambda s: s.get("activePod") == f"{RUN}-{attempt}" and s.get("attempt") == attempt,
        timeout,
        f"attempt {attempt} started",
    )


def ledger_of(status: dict[str, Any]) -> dict[str, Any]:
    return {"goodput": status.get("goodput"), "attempts": status.get("attempts")}


def reconcile_passes(proc: OperatorProcess) -> float | None:
    """The operator's passes so far (its metrics), None while it does not answer yet."""
    try:
        return proc.metrics().get("trainingrun_reconcile_seconds_count", 0.0)
    except OSError:
        return None


def poke(runs: Runs) -> None:
    """A change of the run's metadata: the operator passes over it."""
    runs.patch(RUN, {"metadata": {"annotations": {"test.trainingrun.dev/poke": str(time.time())}}})


def wiped_and_back(runs: Runs, kept: dict[str, Any]) -> str | None:
    """Removes ``goodput`` and ``attempts`` from the run's status (a JSON patch of the status
    subresource) and waits for them back; what went wrong, if anything."""
    wiped = [
        {"op": "remove", "path": "/status/goodput"},
        {"op": "remove", "path": "/status/attempts"},
    ]
    patched = runs.custom.patch_namespaced_custom_object_status(
        api.GROUP,
        api.VERSION,
        runs.namespace,
        api.PLURAL,
        RUN,
        wiped,
        _content_type="application/json-patch+json",  # the client would send a merge patch
    )
    assert ledger_of(patched.get("status") or {}) == {"goodput": None, "attempts": None}
    poke(runs)
    try:
        back = runs.wait_status(
            RUN, lambda s: bool(s.get("goodput") and s.get("attempts")), 30, "the ledger back"
        )
    except AssertionError:
        return "the ledger did not come back within 30 s"
    print_ledger(runs.get(RUN))
    if ledger_of(back) != kept:
        return f"the ledger rebuilt from the bucket differs: {ledger_of(back)}"
    return None


def print_ledger(run: dict[str, Any]) -> None:
    status = run.get("status") or {}
    print(f"Goodput: {ledger.goodput_line(status.get('goodput') or {})}")
    rows = ledger.attempt_rows(status.get("attempts") or [], run["metadata"]["creationTimestamp"])
    table(ledger.HEADERS, rows, sys.stdout)


def test_three_preemptions_the_ledger_matches_the_trainer_and_survives(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    ledger_operator: OperatorProcess,
    core_v1: Any,
    s3: Any,
    tmp_path: Path,
) -> None:
    ns = runs.namespace
    trainer = Trainer(tmp_path)
    body = trainingrun(
        RUN,
        localenv,
        prefix,
        restart_policy={"maxRestarts": 3},
        preemption={"terminationGracePeriodSeconds": 60, "noticeTaints": [NOTICE_TAINT]},
    )
    nodes = [h.node for h in runner_nodes]
    body["spec"]["template"]["spec"] = pod_spec(tmp_path, nodes, MAX_STEPS, SAVE_STEPS, STEP_DELAY)
    began = time.monotonic()
    runs.create(body)

    # 1. The Eviction API: SIGTERM, the trainer saves at the next step end, the sidecar drains.
    wait_attempt(runs, 1)
    trainer.wait_step(1, trainer.target(1))
    evict(core_v1, ns, f"{RUN}-1")
    wait_attempt(runs, 2)

    # 2. A notice taint on its node: the sidecar asks the trainer to save at the next step end.
    trainer.wait_step(2, trainer.target(2))
    node = node_of(runs, f"{RUN}-2")
    before = list(core_v1.read_node(node).to_dict()["spec"].get("taints") or [])
    set_taints(core_v1, node, [*before, {"key": NOTICE_TAINT, "effect": "NoSchedule"}])
    wait_attempt(runs, 3)
    assert node_of(runs, f"{RUN}-3") != node, "attempt 3 on the node with the notice"
    set_taints(core_v1, node, before)

    # 3. The trainer SIGKILLed just after it logged a step, well before its next step's end.
    target = trainer.target(3)
    handle = runner_for(runner_nodes, node_of(runs, f"{RUN}-3"))
    pid = handle.wait_pid(ns, f"{RUN}-3", "trainer")
    killed_at = trainer.wait_step(3, target)
    os.kill(pid, signal.SIGKILL)
    wait_attempt(runs, 4)

    status = runs.wait_status(
        RUN, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300, "the run to end"
    )
    took = time.monotonic() - began
    run = runs.get(RUN)
    print_ledger(run)
    for record in status.get("attempts") or []:
        print(json.dumps(record, sort_keys=True))
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["preemptions"], status["restarts"]) == (4, 2, 1)

    # The trainer's record against the ledger's, per preemption.
    attempts = {a["attempt"]: a for a in status.get("attempts") or []}
    assert sorted(attempts) == [1, 2, 3, 4], status.get("attempts")
    expected_lost = dict.fromkeys(KINDS, 0)
    rows = []
    for attempt, kind in enumerate(KINDS, start=1):
        last, committed = trainer.last(attempt), trainer.resumed(attempt + 1)
        expected_lost[kind] += last - committed
        got = attempts[attempt]
        rows.append(
            [
                f"  {attempt}",
                kind,
                str(last),
                str(committed),
                str(last - committed),
                str(got.get("lastStep")),
                str(got.get("committedStep")),
                str(got.get("stepsLost")),
                f"{got.get('kind')} ({got.get('ending')})",
            ]
        )
    headers = ["  #", "PREEMPTION", "TRAINER LAST", "RESUMED FROM", "LOST", "LEDGER LAST"]
    table([*headers, "LEDGER COMMITTED", "LEDGER LOST", "LEDGER KIND"], rows, sys.stdout)
    goodput = status.get("goodput") or {}
    parts = {p: float(goodput.get(f"{p}Seconds") or 0.0) for p in PARTS}
    wall, percent = float(goodput.get("wallSeconds") or 0.0), goodput.get("percent")
    print(
        f"goodput: {percent}% of {wall}s wall ({', '.join(f'{p} {s}s' for p, s in parts.items())}"
        f"; sum {sum(parts.values()):.1f}s); stepsLost {goodput.get('stepsLost')}; "
        f"the test saw the run take {took:.1f}s"
    )

    # Every disagreement is gathered first, so that one run shows all of them.
    problems = []
    for attempt, kind in enumerate(KINDS, start=1):
        got, last = attempts[attempt], trainer.last(attempt)
        committed = trainer.resumed(attempt + 1)
        want = {"kind": kind, "lastStep": last, "committedStep": committed}
        want["stepsLost"] = last - committed
        if kind == "notice" and not got.get("lastWord"):
            # The ledger says it did not hear the sidecar's last word (seen 2 runs of 6 after a
            # notice: docs/concepts.md, goodput): its last step is then the last one it saw,
            # never more than the trainer's; its steps lost still come right from the step
            # the next attempt resumed from, and are checked.
            print(f"attempt {attempt} (notice): no last word; lastStep {got.get('lastStep')}")
            if not 0 <= (got.get("lastStep") or 0) <= last:
                problems.append(f"attempt {attempt} ({kind}): lastStep {got.get('lastStep')}")
            want.pop("lastStep")
        for field, value in want.items():
            if got.get(field) != value:
                problems.append(
                    f"attempt {attempt} ({kind}): {field} {got.get(field)}, want {value}"
                )
        if attempts[attempt + 1].get("resumeStep") != committed:
            problems.append(f"attempt {attempt + 1}: resumeStep, want {committed}")
    final = attempts[4]
    if (final.get("kind"), final.get("stepsLost"), final.get("lastStep")) != (None, 0, MAX_STEPS):
        problems.append(f"attempt 4: {final}")
    lost = goodput.get("stepsLost") or {}
    if {k: lost.get(k, 0) for k in KINDS} != expected_lost:
        problems.append(f"goodput.stepsLost {lost}, want {expected_lost} (the trainer's record)")
    if lost.get("nodeLost", 0) or lost.get("other", 0):
        problems.append(f"goodput.stepsLost {lost}: nodeLost and other should be 0")
    assert wall > 0 and percent is not None, goodput
    off = abs(percent - 100.0 * parts["productive"] / wall)
    if off > PERCENT_POINTS:
        problems.append(f"percent {percent} is {off:.2f} points off 100 * productive / wall")
    if abs(sum(parts.values()) - wall) > PARTS_RELATIVE * wall:
        problems.append(f"the parts add up to {sum(parts.values()):.1f}s, wall {wall}s")
    if abs(wall - took) > 5.0:
        problems.append(f"wall {wall}s, the test saw the run take {took:.1f}s")
    # Every step the model keeps slept STEP_DELAY (less a second or two per attempt of rounding
    # to whole seconds), and the lost steps took time.
    if parts["productive"] < MAX_STEPS * STEP_DELAY - 2 * len(attempts):
        problems.append(f"productive {parts['productive']}s for {MAX_STEPS} steps")
    if sum(expected_lost.values()) and not parts["lost"]:
        problems.append("no lost seconds for the lost steps")
    # What the trainer's record itself must show, whatever the ledger says.
    assert trainer.last(1) == trainer.resumed(2), "an evicted trainer saves its last step"
    assert trainer.last(2) == trainer.resumed(3), "a noticed trainer saves its last step"
    assert trainer.last(3) == killed_at, "the trainer logged a step after the test saw its last"
    assert trainer.resumed(4) == killed_at // SAVE_STEPS * SAVE_STEPS, "not its last regular save"

    # The operator restarts: its first passes over the run leave the ledger as it was.
    kept = ledger_of(status)
    ledger_operator.stop()
    ledger_operator.start()
    wait_for(lambda: reconcile_passes(ledger_operator) is not None, 60, "the operator serving")
    counted = reconcile_passes(ledger_operator) or 0.0
    poke(runs)
    wait_for(
        lambda: (reconcile_passes(ledger_operator) or 0.0) > counted, 30, "a pass after the poke"
    )
    time.sleep(1)
    if ledger_of(runs.status(RUN)) != kept:
        problems.append(f"the ledger changed when the operator restarted: {runs.status(RUN)}")

    # The status wiped, by the operator that restarted (it never looked for the run's copy),
    # then again: it rebuilds the ledger from its copy in the bucket each time.
    key = f"{prefix}/{ns}/{RUN}/{LEDGER_RECORD}"
    if not s3.list_objects_v2(Bucket=localenv.bucket, Prefix=key).get("KeyCount", 0):
        problems.append(f"{key} is not in the bucket")
    for which in ("first", "second"):
        problem = wiped_and_back(runs, kept)
        if problem:
            problems.append(f"{which} wipe: {problem}")
    print("\n".join(["ledger problems:", *problems]) if problems else "ledger problems: none")
    assert not problems, "\n".join(problems)
