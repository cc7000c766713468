"""The HuggingFace Trainer integration with real training processes (``examples/finetune.py``,
no cluster). A run asked to stop at a step between two saves (SIGTERM, or the sidecar's save-now
request) saves ``checkpoint-<next step>``, marks it complete and exits 143. A fresh process
resumed from it (``TRAININGRUN_RESUME_FROM`` through ``hf.train``, or the Trainer's own
``resume_from_checkpoint=True`` finding it in the output folder) ends with final weights bitwise
equal to an uninterrupted run's, and the same loss at every step after the resume point. A run
killed outright (SIGKILL, as on node loss) resumes from its newest complete checkpoint, replays the
lost steps and ends the same. One resumed from the checkpoint of its last step trains nothing
more and ends with the same weights.

The stop steps come from a seeded RNG (``TRAININGRUN_TEST_SEED``, default 5) and are printed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainingrun.checkpoint import local

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "finetune.py"
MAX_STEPS, SAVE_STEPS = 40, 10
EXIT_STOPPED = 143
SEED = int(os.environ.get("TRAININGRUN_TEST_SEED", "5"))
# Slow enough that a stop request lands within the step after the one the test saw.
STEP_DELAY = 0.25
RUN_TIMEOUT = 300


def losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def checkpoints(ckdir: Path) -> list[int]:
    return [c.step for c in local.scan(ckdir, "hf")]


def start(
    ckdir: Path, loss_log: Path, *extra: str, delay: float = 0.0, resume_from: str = ""
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            f"--max-steps={MAX_STEPS}",
            f"--save-steps={SAVE_STEPS}",
            f"--loss-log={loss_log}",
            f"--step-delay={delay}",
            *extra,
        ],
        env={
            **os.environ,
            "TRAININGRUN_CHECKPOINT_DIR": str(ckdir),
            "TRAININGRUN_RESUME_FROM": resume_from,
        },
        cwd=ckdir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], expected: int) -> None:
    _, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == expected, err[-3000:]


@dataclass(frozen=True)
class Reference:
    weights: bytes
    losses: dict[int, float]
    ckdir: Path


@pytest.fixture(scope="module")
def uninterrupted_reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """An uninterrupted run: every checkpoint marked complete, final weights in final/."""
    work = tmp_path_factory.mktemp("uninterrupted")
    ckdir = work / "ck"
    started = time.monotonic()
    finish(start(ckdir, work / "loss.jsonl"), 0)
    print(f"uninterrupted run of {MAX_STEPS} steps: {time.monotonic() - started:.1f}s")
    assert checkpoints(ckdir) == list(range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS))
    for step in checkpoints(ckdir):
        assert (ckdir / f"checkpoint-{step}" / local.COMPLETE_MARKER).exists()
    progress = local.read_progress(ckdir)
    assert progress is not None
    assert (progress.step, progress.max_steps) == (MAX_STEPS, MAX_STEPS)
    assert progress.samples_per_second is not None and progress.samples_per_second > 0
    weights = (ckdir / "final" / "model.safetensors").read_bytes()
    assert weights == (ckdir / f"checkpoint-{MAX_STEPS}" / "model.safetensors").read_bytes()
    reference_losses = losses(work / "loss.jsonl")
    assert sorted(reference_losses) == list(range(1, MAX_STEPS + 1))
    return Reference(weights, reference_losses, ckdir)


def wait_for_step(proc: subprocess.Popen[str], ckdir: Path, step: int) -> int:
    """Polls the progress file until it shows ``step`` or later; returns the step it showed."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        progress = local.read_progress(ckdir)
        if progress is not None and progress.step >= step:
            return progress.step
        assert proc.poll() is None, f"trainer exited {proc.returncode} before step {step}"
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {RUN_TIMEOUT}s")


def stop_step(case: str) -> int:
    """A step whose end and the next one's are not save steps: the stop lands between saves."""
    candidates = [s for s in range(SAVE_STEPS + 1, MAX_STEPS - 10) if s % SAVE_STEPS not in (0, 9)]
    return random.Random(f"{SEED}-{case}").choice(candidates)


@pytest.mark.parametrize(
    ("how", "resume"),
    [("sigterm", "env"), ("save-now", "output-dir"), ("sigkill", "env")],
    ids=[
        "sigterm-then-resume-from-env",
        "save-now-then-resume-from-checkpoint-true",
        "sigkill-then-resume-from-last-complete",
    ],
)
def test_stop_and_resume_is_exact(
    tmp_path: Path, uninterrupted_reference: Reference, how: str, resume: str
) -> None:
    ckdir = tmp_path / "ck"
    first_log, second_log = tmp_path / "loss-1.jsonl", tmp_path / "loss-2.jsonl"
    target = stop_step(how)

    proc = start(ckdir, first_log, delay=STEP_DELAY)
    seen = wait_for_step(proc, ckdir, target)
    asked = time.monotonic()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        proc.kill()
    else:
        local.request_save(ckdir, "preemption notice: test")
    finish(proc, -signal.SIGKILL if how == "sigkill" else EXIT_STOPPED)
    complete = [
        s
        for s in checkpoints(ckdir)
        if (ckdir / f"checkpoint-{s}" / local.COMPLETE_MARKER).exists()
    ]
    if how == "sigkill":
        # Killed during step seen + 1: nothing past the regular saves, and a regular save of
        # step seen + 1 only if it finished before the kill.
        regular = list(range(SAVE_STEPS, seen + 2, SAVE_STEPS))
        assert complete in (regular, [s for s in regular if s <= seen])
        saved = complete[-1]
    else:
        saved = seen + 1
        assert checkpoints(ckdir) == [*range(SAVE_STEPS, saved, SAVE_STEPS), saved]
        assert complete == checkpoints(ckdir)
    print(
        f"seed {SEED}, {how}: picked step {target}, stopped after step {seen}, resuming from "
        f"checkpoint-{saved}; the process ended {time.monotonic() - asked:.1f}s after the request"
    )
    assert not (ckdir / "final").exists(), "a stopped run must not write final weights"
    before = losses(first_log)
    assert set(range(1, saved + 1)) <= set(before)
    assert all(before[s] == uninterrupted_reference.losses[s] for s in before)

    # The next attempt: a fresh process resuming from the saved checkpoint.
    (ckdir / local.CONTROL_DIR / local.SAVE_NOW).unlink(missing_ok=True)  # a new pod's volume
    if resume == "env":
        proc = start(ckdir, second_log, resume_from=str(ckdir / f"checkpoint-{saved}"))
    else:
        proc = start(ckdir, second_log, "--resume=output-dir")
    finish(proc, 0)
    assert (ckdir / "final" / "model.safetensors").read_bytes() == uninterrupted_reference.weights
    after = losses(second_log)
    assert sorted(after) == list(range(saved + 1, MAX_STEPS + 1))
    differing = [s for s in after if after[s] != uninterrupted_reference.losses[s]]
    assert not differing, f"loss differs after the resume point at steps {differing}"


def test_resume_from_the_last_step_trains_nothing_more(
    tmp_path: Path, uninterrupted_reference: Reference
) -> None:
    """An attempt that stopped after its last save but before it exited: the next one resumes
    from checkpoint-<max steps> and must end with the same weights without training a step
    (the Trainer resumed there would train step max + 1)."""
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    last = f"checkpoint-{MAX_STEPS}"
    shutil.copytree(uninterrupted_reference.ckdir / last, ckdir / last)
    log_path = tmp_path / "loss.jsonl"

    finish(start(ckdir, log_path, resume_from=str(ckdir / last)), 0)

    assert checkpoints(ckdir) == [MAX_STEPS]
    assert (ckdir / "final" / "model.safetensors").read_bytes() == uninterrupted_reference.weights
    assert not log_path.exists() or losses(log_path) == {}
