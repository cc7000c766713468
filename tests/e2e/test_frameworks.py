"""Lightning and Composer end to end: the operator, the real control plane, SeaweedFS, two local
pod runner nodes, and the examples (examples/lightning_finetune.py, examples/composer_finetune.py)
as the trainer, each with the real library from PyPI in its own virtualenv
(hack/trainer-env.sh). The sidecar finds their checkpoints with ``format: auto``.

Covers:
- for each framework, a run evicted (Eviction API) at a random step between saves and then
  SIGKILLed at a random step between saves ends Succeeded with attempt 3, one preemption and one
  restart; every attempt resumed from the newest checkpoint committed when it started (the
  bucket manifest's entries of older epochs), which the framework loaded (its first step is the
  next one); the final weights are bitwise equal to an uninterrupted run's and the losses after
  the last resume equal its losses; an eviction loses at most one step (the framework's
  TrainingRun callback saves at the next step end); steps lost per disruption are printed;
- Composer-style autoresume: the run deleted once checkpoint 20 is committed, and the same
  manifest applied again: its attempt 1 resumes from the newest committed checkpoint, Composer
  loads it, and the run ends with the uninterrupted run's weights;
- MindFormers-style roll-back: with two checkpoints committed, the newest one's objects damaged
  in the bucket and the trainer SIGKILLed: the restore refuses it (``status.badCheckpoints``,
  Event ``CheckpointBad``), the run resumes from the last intact one and ends with the
  uninterrupted run's weights.

Each test prints its wall time, and the module its total.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.example import losses
from tests.e2e.frameworks import (
    FRAMEWORKS,
    MAX_STEPS,
    SAVE_STEPS,
    FrameworkRun,
    Reference,
    References,
    framework_run,
    newest_before,
)
from tests.integration.support import Runs, evict, wait_for
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle

pytestmark = pytest.mark.usefixtures("operator")

STEP_DELAY = 0.25
STEPS = (MAX_STEPS, SAVE_STEPS, STEP_DELAY)
SEED = int(os.environ.get("TRAININGRUN_E2E_SEED", "20261124"))
END_TIMEOUT_S = 600


@pytest.fixture(scope="module", autouse=True)
def module_clock() -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"\n{__name__}: {time.monotonic() - started:.0f}s in all")


@pytest.fixture(autouse=True)
def test_clock(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"\n{request.node.name}: {time.monotonic() - started:.0f}s")


def start_run(
    name: str,
    framework: str,
    references: References,
    runs: Runs,
    env: LocalEnv,
    prefix: str,
    nodes: list[RunnerHandle],
    loss_dir: Path,
) -> tuple[FrameworkRun, Reference]:
    stack = references(framework)
    body = framework_run(
        name, env, prefix, framework, stack.python, loss_dir, [h.node for h in nodes], STEPS
    )
    run = FrameworkRun(runs, env, prefix, name, loss_dir, nodes, body)
    run.create()
    return run, stack.reference


def between_saves(step: int) -> int:
    """``step``, or the next one when a save falls on it."""
    return step + 1 if step % SAVE_STEPS == 0 else step


def wait_end(runs: Runs, name: str) -> dict[str, Any]:
    return runs.wait_status(
        name,
        lambda s: s.get("phase") in ("Succeeded", "Failed"),
        END_TIMEOUT_S,
        f"{name} to end",
    )


def resume_file(framework: str, step: int) -> str:
    """The end of TRAININGRUN_RESUME_FROM for a checkpoint of ``step``: the file the
    framework's resume argument takes."""
    return f"-step={step}.ckpt" if framework == "lightning" else f"-ba{step}-rank0.pt"


def assert_matches_reference(run: FrameworkRun, attempt: int, ref: Reference) -> None:
    """The final weights of ``attempt`` (the last) are the reference's, bitwise, and so is the
    loss of every step it trained."""
    assert run.final_weights(attempt) == ref.weights, "final weights differ from the reference"
    last = losses(run.log(attempt))
    assert sorted(last) == list(range(run.resume_step(attempt) + 1, MAX_STEPS + 1))
    assert last == {s: ref.losses[s] for s in last}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_evicted_then_killed_resumes_to_the_uninterrupted_weights(
    framework: str,
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    core_v1: Any,
    s3: Any,
    tmp_path: Path,
    reference_stacks: References,
) -> None:
    rng = random.Random(f"{SEED}-{framework}")
    run, ref = start_run(
        framework, framework, reference_stacks, runs, localenv, prefix, runner_nodes, tmp_path
    )
    ns = runs.namespace
    resumed_at_start: dict[int, int | None] = {}  # attempt -> status.resumeStep at its start

    # 1. Eviction API between saves: SIGTERM; the callback saves at the next step end and the
    # sidecar commits that save in its drain.
    resumed_at_start[1] = run.wait_attempt(1).get("resumeStep")
    run.wait_resume_step(1)
    run.wait_step(1, between_saves(rng.randint(SAVE_STEPS + 1, 2 * SAVE_STEPS - 1)))
    evict(core_v1, ns, run.pod(1))
    resumed_at_start[2] = run.wait_attempt(2).get("resumeStep")

    # 2. SIGKILL between saves, after the attempt's first save.
    start = run.wait_resume_step(2)
    first_save = (start // SAVE_STEPS + 1) * SAVE_STEPS
    target = between_saves(min(first_save + rng.randint(1, SAVE_STEPS - 1), MAX_STEPS - 1))
    run.wait_step(2, target)
    assert run.step(2) < MAX_STEPS, "the trainer finished before the kill; raise STEP_DELAY"
    run.signal_trainer(2, signal.SIGKILL)
    resumed_at_start[3] = run.wait_attempt(3).get("resumeStep")
    run.wait_resume_step(3)

    status = wait_end(runs, framework)
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 3
    assert status["preemptions"] == 1 and status["restarts"] == 1
    assert (status.get("latestCheckpoint") or {}).get("format") == framework

    # Every attempt resumed from the newest checkpoint committed when it took the fence, and
    # the framework loaded it: the attempt's first step is the next one.
    manifest = run.manifest(s3)
    assert manifest is not None
    print(f"{framework}: committed {[(e.step, e.epoch) for e in manifest.entries]}")
    for attempt in (1, 2, 3):
        newest = newest_before(manifest, run.epochs[attempt])
        assert run.resume_step(attempt) == newest, f"attempt {attempt}"
        assert (resumed_at_start[attempt] or 0) == newest, f"attempt {attempt}"
        if newest:
            assert run.resumes[attempt].endswith(resume_file(framework, newest))
        else:
            assert run.resumes[attempt] == ""
    assert_matches_reference(run, 3, ref)

    lost = []
    for attempt, how in ((1, "Eviction API"), (2, "trainer SIGKILL")):
        trained, resumed = run.step(attempt), run.resume_step(attempt + 1)
        assert resumed <= trained
        lost.append(trained - resumed)
        print(f"{framework} {how}: trained to step {trained}, resumed from {resumed}: ", end="")
        print(f"{trained - resumed} steps lost")
    assert lost[0] <= 1, "a graceful eviction should lose no step: the save comes first"


def test_reapplied_composer_run_resumes_from_the_newest_committed_checkpoint(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    s3: Any,
    tmp_path: Path,
    reference_stacks: References,
) -> None:
    name = "autoresume"
    run, ref = start_run(
        name, "composer", reference_stacks, runs, localenv, prefix, runner_nodes, tmp_path
    )
    run.wait_attempt(1)
    wait_for(
        lambda: any(s >= 2 * SAVE_STEPS for s in run.committed(s3)), 300, "checkpoint 20 committed"
    )
    run.delete()
    wait_for(run.gone, 120, f"{name} deleted")
    wait_for(lambda: not runs.pods_of(name), 240, f"the pod of the deleted {name} gone")
    # The same manifest applied again writes the same loss log: keep the first run's aside.
    deleted_log = run.log(1).rename(tmp_path / "deleted-run-loss-1.jsonl")
    trained = max(losses(deleted_log))
    assert trained < MAX_STEPS, "the run finished before it was deleted; raise STEP_DELAY"
    before = run.manifest(s3)
    assert before is not None and before.entries
    newest = max(e.step for e in before.entries)

    run.create()
    status = run.wait_attempt(1)
    assert status.get("resumeStep") == newest
    assert run.epochs[1] > max(e.epoch for e in before.entries)
    assert run.resumes[1].endswith(resume_file("composer", newest))
    resumed = run.wait_resume_step(1)
    print(f"deleted at step {trained}, the new run resumed from {resumed}: ", end="")
    print(f"{trained - resumed} steps lost")
    assert resumed == newest, "Composer did not go on from the checkpoint it was given"

    status = wait_end(runs, name)
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1
    assert status["preemptions"] == 0 and status["restarts"] == 0
    assert_matches_reference(run, 1, ref)


def freeze_between_saves(run: FrameworkRun, attempt: int) -> int:
    """Stops the trainer (SIGSTOP) at a step on which no save falls, so the newest checkpoint
    in its folder is the last save and no newer one comes; returns that step."""
    for _ in range(20):
        run.signal_trainer(attempt, signal.SIGSTOP)
        time.sleep(0.5)  # a loss line being written lands
        step = run.step(attempt)
        if step % SAVE_STEPS:
            return step
        run.signal_trainer(attempt, signal.SIGCONT)
        run.wait_step(attempt, step + 1)
    raise AssertionError("the trainer never stopped between two saves")


def test_damaged_newest_checkpoint_rolls_back_to_the_last_intact_one(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    s3: Any,
    tmp_path: Path,
    reference_stacks: References,
) -> None:
    name = "rollback"
    run, ref = start_run(
        name, "lightning", reference_stacks, runs, localenv, prefix, runner_nodes, tmp_path
    )
    run.wait_attempt(1)
    run.wait_step(1, 2 * SAVE_STEPS + 1)
    frozen = freeze_between_saves(run, 1)
    newest = frozen // SAVE_STEPS * SAVE_STEPS
    committed = list(range(SAVE_STEPS, newest + 1, SAVE_STEPS))
    wait_for(lambda: run.committed(s3) == committed, 120, f"checkpoints {committed} committed")
    damaged = run.damage(s3, newest)
    assert damaged, f"checkpoint {newest} has no objects"
    run.signal_trainer(1, signal.SIGKILL)

    status = wait_end(runs, name)
    assert status["phase"] == "Succeeded", status
    assert status["badCheckpoints"] == [newest]
    assert status["attempt"] == 3
    assert status["preemptions"] == 0 and status["restarts"] == 1
    # Attempt 2 chose the damaged checkpoint and its restore refused it, so its trainer never
    # ran; attempt 3 resumed from the one before.
    assert not run.log(2).exists()
    run.note(3)
    assert run.resume_step(3) == committed[-2]
    assert run.resumes[3].endswith(resume_file("lightning", committed[-2]))
    assert runs.wait_events(name, "CheckpointBad")
    print(f"checkpoint {newest} damaged: rolled back to {committed[-2]}")
    assert_matches_reference(run, 3, ref)
