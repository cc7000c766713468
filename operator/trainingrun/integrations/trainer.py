"""The trainer's side of a TrainingRun for any training loop: ``trainingrun.integrations.trainer``.

Standard library only: a hand-written loop needs nothing else, and the framework callbacks
(``trainingrun.integrations.hf``, ``trainingrun.integrations.lightning``,
``trainingrun.integrations.composer``) build on it::

    from trainingrun.integrations import trainer

    stop = trainer.StopRequest()                  # catches SIGTERM from here on
    resume = trainer.resume_from()                # the restored checkpoint, or None
    step = load(resume) if resume else 0
    while step < max_steps:
        step += 1
        train_one_step()
        trainer.report_progress(step, max_steps, samples_per_second=rate)
        if step % save_steps == 0 or stop.reason():
            path = save(trainer.checkpoint_dir() / f"step_{step}")
            trainer.mark_complete(path)           # the sidecar uploads it at once
            if stop.reason():
                sys.exit(trainer.EXIT_STOPPED)    # 143: stopped to be resumed, not finished

- ``StopRequest.reason()`` says why the run should save and stop: ``"SIGTERM"`` (the pod is
  being deleted or evicted; the grace period is ``spec.preemption.terminationGracePeriodSeconds``)
  or the sidecar's save-now request (a preemption notice, before any signal). None otherwise.
  Checking it costs a ``stat`` of one small file: once per step is fine.
- ``mark_complete(path)`` tells the sidecar a checkpoint (a folder, or a single file) is whole:
  without it the sidecar waits for the format's own proof or a quiet period
  (docs/checkpoints.md).
- ``resume_from()`` is ``TRAININGRUN_RESUME_FROM``: the restored checkpoint in the form the
  format's resume argument takes (a folder, or a file), or None on a fresh start. With
  ``spec.checkpoint.restoreMode: AlongsideTrainer`` the restore runs while the trainer starts,
  and ``resume_from()`` waits for its verified checkpoint: call it after the slow imports.
- Exit ``EXIT_STOPPED`` after an early stop, never 0: the operator counts a trainer's exit 0 as
  the run finished.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from trainingrun.checkpoint import local
from trainingrun.contract import (
    ENV_CHECKPOINT_DIR,
    ENV_RESUME_FROM,
    ENV_RESUME_WAIT,
    EXIT_STOPPED,
)

__all__ = [
    "EXIT_STOPPED",
    "RestoreFailed",
    "StopOutcome",
    "StopRequest",
    "Throughput",
    "checkpoint_dir",
    "mark_complete",
    "report_progress",
    "resume_from",
    "wait_for_restore",
]

SIGTERM_REASON = "SIGTERM"
# The stop reason of a rank that was not asked to stop itself but stops with the others.
PEER_STOP = "stop requested on another rank"

log = logging.getLogger("trainingrun")


def checkpoint_dir(default: str | Path = "checkpoints") -> Path:
    """The folder the sync sidecar watches (``TRAININGRUN_CHECKPOINT_DIR``): save checkpoints in
    it. ``default`` outside a TrainingRun."""
    return Path(os.environ.get(ENV_CHECKPOINT_DIR) or default)


class RestoreFailed(RuntimeError):
    """The restore beside the trainer did not put the checkpoint in place; the operator ends the
    attempt from the restore's exit code."""


def resume_from(folder: bool = False) -> Path | None:
    """The restored checkpoint to resume from, or None on a fresh start; ``folder``: it must be
    a folder (the formats whose resume argument is one). When the restore runs beside the
    trainer (``restoreMode: AlongsideTrainer``), this waits until it has verified the checkpoint
    in place, and raises ``RestoreFailed`` when it could not."""
    value = os.environ.get(ENV_RESUME_FROM, "")
    if not value:
        return None
    if os.environ.get(ENV_RESUME_WAIT) == "1":
        wait_for_restore(checkpoint_dir())
    path = Path(value)
    if not (path.is_dir() if folder else path.exists()):
        what = "is not a folder" if folder else "does not exist"
        raise FileNotFoundError(
            f"{ENV_RESUME_FROM}={value} {what}: the restore init container puts the "
            "checkpoint there; check that the trainer container mounts the checkpoint volume at "
            "spec.checkpoint.localPath"
        )
    return path


def wait_for_restore(folder: Path, poll_s: float = 0.05, say_every_s: float = 60) -> None:
    """Waits for the outcome of the restore that runs beside the trainer (``local.RESTORED``)."""
    started = last = time.monotonic()
    log.info("waiting for the restore beside the trainer to verify the checkpoint")
    while (outcome := local.read_restored(folder)) is None:
        time.sleep(poll_s)
        if time.monotonic() - last >= say_every_s:
            last = time.monotonic()
            log.info("still waiting for the restore (%.0f s)", last - started)
    if outcome.exit_code != 0:
        raise RestoreFailed(
            f"the restore beside the trainer exited {outcome.exit_code}: {outcome.message}"
        )
    log.info("the restore is done after %.1f s of waiting", time.monotonic() - started)


def mark_complete(path: str | Path) -> None:
    """Marks a checkpoint (a folder, or a single file) whole; call it after every file of it is
    written. Under torch.distributed, call it once per node after a barrier."""
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"cannot mark {target} complete: it does not exist")
    local.mark_complete(target)


def report_progress(
    step: int,
    max_steps: int | None,
    folder: str | Path | None = None,
    *,
    samples_per_second: float | None = None,
    tokens_per_second: float | None = None,
    save_seconds: float | None = None,
) -> None:
    """The trainer's step, its total when known, its throughput when measured and the seconds
    it spent blocked in saves since it began (the goodput ledger's checkpoint stall), for the
    sidecar to publish (``trainingrun_trainer_step``, ``status.progress``). The file is
    replaced atomically; once per step is fine."""
    progress = local.Progress(step, max_steps, samples_per_second, tokens_per_second, save_seconds)
    local.write_progress(Path(folder) if folder else checkpoint_dir(), progress)


class Throughput:
    """Items (samples, tokens) per second since the first count given in this process: the
    attempt's own rate, steadier than the last step's. A count going back starts it again."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.start: tuple[int, float] | None = None

    def rate(self, count: int) -> float | None:
        """The rate with ``count`` items done so far; None until there is one."""
        now = self.clock()
        if self.start is None or count < self.start[0]:
            self.start = (count, now)
            return None
        done, elapsed = count - self.start[0], now - self.start[1]
        return done / elapsed if done > 0 and elapsed > 0 else None


class StopRequest:
    """Whether the run was asked to save and stop: SIGTERM, or the sidecar's save-now request.

    The SIGTERM handler is installed on creation (``install=False`` to do it later with
    ``install()``) and only records the signal; ``restore()`` (or leaving a ``with`` block) puts
    the previous handler back. Python allows handlers in the main thread only: elsewhere
    ``install()`` does nothing and only the save-now request is seen.
    """

    def __init__(self, folder: str | Path | None = None, *, install: bool = True) -> None:
        self.folder = Path(folder) if folder else checkpoint_dir()
        self.signalled: str | None = None
        self._previous: Any = None
        self._installed = False
        if install:
            self.install()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self.signalled = SIGTERM_REASON  # only a flag: the loop acts on it at its next step end

    def install(self) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def reason(self, folder: Path | None = None) -> str | None:
        """Why to stop (``"SIGTERM"``, or the save-now request's reason), or None; the request
        is read in ``folder`` when given (a trainer whose folder is known only later)."""
        return self.signalled or local.save_requested(folder or self.folder)

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


class StopOutcome:
    """Why training stopped early, if it did, and the exit code that follows: the framework
    callbacks set ``stop_reason`` when asked to stop and ``finished`` when the stop came at the
    last step anyway (nothing was cut short)."""

    stop_reason: str | None = None
    finished: bool = False

    @property
    def stopped_early(self) -> bool:
        return self.stop_reason is not None and not self.finished

    @property
    def exit_code(self) -> int:
        """The exit code the training process should end with: 0, or ``EXIT_STOPPED``."""
        return EXIT_STOPPED if self.stopped_early else 0

    def log_stopped(self, log: logging.Logger, where: str) -> None:
        """Says, when training stopped early, why and where (``step 12``), and the exit code."""
        if self.stopped_early:
            log.warning(
                "stopped early (%s) at %s after saving; exit %d",
                self.stop_reason,
                where,
                EXIT_STOPPED,
            )
