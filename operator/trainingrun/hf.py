"""HuggingFace Trainer integration: ``trainingrun.hf``.

One line in a training script::

    from trainingrun import hf
    sys.exit(hf.train(trainer))      # resumes, saves on preemption, exits 0 only when done

or, keeping control of ``trainer.train``::

    callback = hf.attach(trainer)
    trainer.train(resume_from_checkpoint=hf.resume_checkpoint())

The callback:

- marks each saved ``checkpoint-<step>/`` complete (after the Trainer has written every file), so
  the sync sidecar uploads it at once instead of waiting for a quiet period;
- turns SIGTERM, or the sidecar's "save now" request (a preemption notice), into a save at the
  next step end followed by a clean stop;
- writes progress (step, max steps) for the sidecar to publish.

``resume_checkpoint()`` is the folder the restore put in place (``TRAININGRUN_RESUME_FROM``), or
None on a fresh start. Since the restore writes into the output folder, ``trainer.train(
resume_from_checkpoint=True)`` finds it too. Only training scripts import this module; it needs
``transformers`` (the ``hf`` extra).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainingrun import local
from trainingrun.manifest import checkpoint_dirname

log = logging.getLogger("trainingrun.hf")

# Exit code of a run stopped early to be preempted: 128 + SIGTERM, as if the signal had ended
# it, so it is never mistaken for a finished run.
EXIT_STOPPED = 143


def resume_checkpoint() -> str | None:
    """The restored checkpoint folder to resume from, or None on a fresh start."""
    path = os.environ.get("TRAININGRUN_RESUME_FROM", "")
    if not path:
        return None
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"TRAININGRUN_RESUME_FROM={path} does not exist: the restore init container should "
            "have put the checkpoint there; check that the trainer mounts the checkpoint volume"
        )
    return path


class TrainingRunCallback(TrainerCallback):
    """Completion markers, save-and-stop on SIGTERM or notice, progress. See the module doc."""

    def __init__(self, checkpoint_dir: str | Path | None = None) -> None:
        configured = checkpoint_dir or os.environ.get("TRAININGRUN_CHECKPOINT_DIR") or None
        self.checkpoint_dir = Path(configured) if configured else None
        self.stop_reason: str | None = None  # why training stopped early, if it did
        self._signalled: str | None = None
        self._previous_handler: Any = None
        self._installed = False

    def _folder(self, args: TrainingArguments) -> Path:
        return self.checkpoint_dir or Path(str(args.output_dir))

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self._signalled = "SIGTERM"

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> TrainerControl:
        folder = self._folder(args)
        if state.is_world_process_zero:
            local.write_progress(folder, local.Progress(state.global_step, state.max_steps))
        reason = self._signalled or local.save_requested(folder)
        if reason and self.stop_reason is None:
            self.stop_reason = reason
            log.warning("%s: saving checkpoint-%d now and stopping", reason, state.global_step)
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        folder = Path(str(args.output_dir)) / checkpoint_dirname(state.global_step)
        if folder.is_dir():
            local.mark_complete(folder)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._installed = False


def attach(trainer: Any, checkpoint_dir: str | Path | None = None) -> TrainingRunCallback:
    """Adds the callback to ``trainer`` and returns it."""
    callback = TrainingRunCallback(checkpoint_dir)
    trainer.add_callback(callback)
    return callback


def train(trainer: Any) -> int:
    """Trains, resuming from the restored checkpoint if any; returns the process exit code:
    0 when training finished, ``EXIT_STOPPED`` when it stopped early to be preempted."""
    callback = attach(trainer)
    trainer.train(resume_from_checkpoint=resume_checkpoint())
    if callback.stop_reason:
        log.warning(
            "stopped early (%s) after saving; exiting %d", callback.stop_reason, EXIT_STOPPED
        )
        return EXIT_STOPPED
    return 0
