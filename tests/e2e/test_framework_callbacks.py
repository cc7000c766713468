"""The Lightning and Composer integrations (``trainingrun.integrations.lightning``,
``trainingrun.integrations.composer``)
with the real libraries, in their stacks' virtualenvs, as plain local processes (no cluster).

A run asked to stop between two saves (SIGTERM, or the sidecar's save-now request) saves the step
after the one it reported, in the framework's own format, proved whole for the sidecar (our
marker beside a Lightning file; Composer's latest link), and exits 143. A fresh process resumed
from that file (``TRAININGRUN_RESUME_FROM``) ends with final weights bitwise equal to an
uninterrupted run's, and the same loss at every step after the resume point. One resumed from the
checkpoint of the last step trains nothing and ends with the same weights. The progress file
the sidecar publishes says the run's total steps, and under Composer its samples per second.

The stop steps come from a seeded RNG (``TRAININGRUN_TEST_SEED``, default 5) and are printed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.example import REPO, losses
from tests.e2e.frameworks import (
    FRAMEWORKS,
    MAX_STEPS,
    SAVE_STEPS,
    References,
    Stack,
    launch,
    stack_python,
)
from tests.e2e.test_trainer_resume import RUN_TIMEOUT, SEED, finish, stop_step
from trainingrun.checkpoint import local
from trainingrun.contract import EXIT_STOPPED

# stop_step and finish are the HF Trainer tests': their MAX_STEPS and SAVE_STEPS are these.
STEP_DELAY = 0.25  # a stop request lands within the step after the one the test saw


@pytest.fixture(scope="module", params=FRAMEWORKS)
def stack(request: pytest.FixtureRequest, reference_stacks: References) -> Stack:
    """A framework, its python and its uninterrupted run (once per session)."""
    stack = reference_stacks(str(request.param))
    framework, reference = stack.framework, stack.reference
    assert sorted(reference.losses) == list(range(1, MAX_STEPS + 1))
    survey = local.survey(stack.ckdir)
    assert survey.formats == (framework,)
    assert [c.step for c in survey.checkpoints] == list(
        range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS)
    )
    assert all(c.marked for c in survey.checkpoints), "every save is proved whole at once"
    return stack


def wait_for_step(proc: subprocess.Popen[str], ckdir: Path, step: int) -> int:
    """Polls the progress file (written after the step end's stop check) until it shows
    ``step`` or later; returns the step it showed."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        progress = local.read_progress(ckdir)
        if progress is not None and progress.step >= step:
            return progress.step
        if proc.poll() is not None:
            output = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"exited {proc.returncode} before step {step}: {output}")
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {RUN_TIMEOUT}s")


@pytest.mark.parametrize("how", ["sigterm", "save-now"])
def test_stop_saves_the_next_step_and_resumes_exactly(
    stack: Stack, tmp_path: Path, how: str
) -> None:
    framework, python, reference = stack.framework, stack.python, stack.reference
    ckdir, first, second = tmp_path / "ck", tmp_path / "loss-1.jsonl", tmp_path / "loss-2.jsonl"
    target = stop_step(f"{framework}-{how}")

    proc = launch(framework, python, ckdir, first, STEP_DELAY)
    seen = wait_for_step(proc, ckdir, target)
    asked = time.monotonic()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        local.request_save(ckdir, "preemption notice: test")
    finish(proc, EXIT_STOPPED)
    print(
        f"seed {SEED}, {framework} {how}: stopped after step {seen}, the process ended "
        f"{time.monotonic() - asked:.1f}s after the request"
    )

    progress = local.read_progress(ckdir)  # what the sidecar publishes for status.progress
    assert progress is not None and progress.max_steps == MAX_STEPS
    if framework == "composer":  # Composer counts its samples: a throughput comes with them
        assert progress.samples_per_second is not None and progress.samples_per_second > 0

    survey = local.survey(ckdir)
    saved = seen + 1
    assert survey.formats == (framework,)
    assert [c.step for c in survey.checkpoints] == [*range(SAVE_STEPS, saved, SAVE_STEPS), saved]
    assert all(c.marked for c in survey.checkpoints)
    assert survey.unrecognised == ()
    assert not (ckdir / "final").exists(), "a stopped run must not write final weights"
    before = losses(first)
    assert sorted(before) == list(range(1, saved + 1))
    assert all(before[s] == reference.losses[s] for s in before)

    # The next attempt: a fresh process in a fresh folder, resuming from the saved file.
    newest = survey.checkpoints[-1]
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copy(ckdir / newest.found.resume, restored / Path(newest.found.resume).name)
    resume = restored / Path(newest.found.resume).name
    finish(launch(framework, python, restored, second, resume=str(resume)), 0)
    assert (restored / "final" / "weights.bin").read_bytes() == reference.weights
    after = losses(second)
    assert sorted(after) == list(range(saved + 1, MAX_STEPS + 1))
    differing = [s for s in after if after[s] != reference.losses[s]]
    assert not differing, f"loss differs after the resume point at steps {differing}"


def test_resume_from_the_last_step_trains_nothing_more(stack: Stack, tmp_path: Path) -> None:
    """An attempt that saved its last step but was stopped before it exited: the next one
    resumes from that file and ends with the same weights without training a step."""
    last = local.survey(stack.ckdir).checkpoints[-1]
    assert last.step == MAX_STEPS
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    resume = ckdir / Path(last.found.resume).name
    shutil.copy(stack.ckdir / last.found.resume, resume)
    log = tmp_path / "loss.jsonl"
    finish(launch(stack.framework, stack.python, ckdir, log, resume=str(resume)), 0)
    assert (ckdir / "final" / "weights.bin").read_bytes() == stack.reference.weights
    assert losses(log) == {}


# A tiny LightningModule for the scripts below; ``M`` sends itself SIGTERM at step ``sigterm_at``
# (None: never) from its own on_train_batch_end, which Lightning runs after every callback's.
MODULE = """
import os, signal, sys
import lightning.pytorch as pl, torch

class M(pl.LightningModule):
    def __init__(self, sigterm_at=None):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)
        self.sigterm_at = sigterm_at
    def training_step(self, batch, i):
        return self.w(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
    def on_train_batch_end(self, outputs, batch, i):
        if self.trainer.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)

def data(n):
    rows = torch.utils.data.TensorDataset(torch.ones(n, 2))
    return torch.utils.data.DataLoader(rows, batch_size=2)
"""

LISTED_BEFORE = """
from lightning.pytorch.callbacks import ModelCheckpoint
from trainingrun.integrations.lightning import TrainingRunCallback

trainer = pl.Trainer(
    max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
    callbacks=[TrainingRunCallback("ck"), ModelCheckpoint(dirpath="ck")],
)
trainer.fit(M(), data(4))
"""

# A SIGTERM at step 3 lands after TrainingRunCallback's stop check of that batch end and before
# Lightning's own check.
SIGTERM_AFTER_THE_CHECK = """
from trainingrun.integrations import lightning as tr

trainer = pl.Trainer(
    max_steps=10, logger=False, enable_progress_bar=False, enable_model_summary=False,
    callbacks=[tr.TrainingRunCallback("ck")],
)
sys.exit(tr.fit(trainer, M(sigterm_at=3), train_dataloaders=data(32)))
"""


def run_lightning(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """MODULE then ``script``, run by the Lightning stack's python in ``cwd``."""
    python = stack_python("lightning")
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    return subprocess.run(
        [str(python), "-c", MODULE + script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def test_lightning_callback_listed_before_modelcheckpoint_is_refused(tmp_path: Path) -> None:
    proc = run_lightning(LISTED_BEFORE, tmp_path)

    assert proc.returncode == 1
    assert "list it after every ModelCheckpoint" in proc.stderr
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").glob("*.ckpt"))


def test_lightning_sigterm_after_the_step_end_check_still_saves_the_next_step(
    tmp_path: Path,
) -> None:
    proc = run_lightning(SIGTERM_AFTER_THE_CHECK, tmp_path)

    assert proc.returncode == EXIT_STOPPED, proc.stderr[-3000:]
    survey = local.survey(tmp_path / "ck")
    assert [(c.step, c.marked) for c in survey.checkpoints] == [(4, True)], proc.stderr[-3000:]
