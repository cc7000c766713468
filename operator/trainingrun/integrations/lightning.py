"""PyTorch Lightning integration: ``trainingrun.integrations.lightning``.

In a training script, after the ``ModelCheckpoint`` that saves into the checkpoint folder::

    from trainingrun.integrations import lightning as tr

    checkpoints = ModelCheckpoint(dirpath=tr.checkpoint_dir(), every_n_train_steps=500)
    trainer = pl.Trainer(callbacks=[checkpoints, tr.TrainingRunCallback()], ...)
    sys.exit(tr.fit(trainer, model, datamodule=data))   # resumes; 0 only when training is done

The callback:

- marks each ``.ckpt`` file saved into the checkpoint folder complete once written, so the sync
  sidecar uploads it at once instead of waiting for a quiet period;
- turns SIGTERM (Lightning's own handler records it: ``trainer.received_sigterm``) or the
  sidecar's save-now request (a preemption notice) into a save at the next optimizer step's end,
  ``<folder>/epoch=E-step=S.ckpt`` (skipped when a ``ModelCheckpoint`` saved that step), marked
  complete, then a stop (``trainer.should_stop``). The save happens at the batch end, where
  ``ModelCheckpoint`` saves too: the checkpoint holds the loops' position within the epoch, and a
  resume goes on with the next batch. Under torch.distributed the ranks decide together (any
  rank asked: all save and stop); every rank calls ``trainer.save_checkpoint``, as Lightning
  requires. Lightning ends a SIGTERMed fit at the end of the batch, after the callbacks: in one
  process, a SIGTERM that lands after this callback's check of a batch end is held until the
  next batch starts, so that batch's end saves rather than the fit ending unsaved;
- writes progress (step, max steps) for the sidecar to publish.

It is a ``Checkpoint`` callback, so Lightning runs it after the other callbacks; among the
checkpoint callbacks, list it after the ``ModelCheckpoint`` (the order is kept), or ``setup``
raises: it must see what they saved at a batch end before it saves that step itself.

Exit code: ``fit`` returns ``EXIT_STOPPED`` (143) after an early stop. Lightning ends a
SIGTERMed fit with ``SIGTERMException``, a ``SystemExit`` without a code: a script that let it
through would exit 0, which the operator takes for a finished run.

Only training scripts import this module (it needs ``lightning``); the operator never does.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from trainingrun.checkpoint import local
from trainingrun.checkpoint.layouts.frameworks import lightning_step
from trainingrun.contract import EXIT_STOPPED
from trainingrun.integrations import trainer as neutral

__all__ = ["EXIT_STOPPED", "TrainingRunCallback", "checkpoint_dir", "fit"]

checkpoint_dir = neutral.checkpoint_dir

log = logging.getLogger("trainingrun.integrations.lightning")

# The name of a checkpoint saved on a stop request: ModelCheckpoint's default.
STOP_FILENAME = "epoch={epoch}-step={step}.ckpt"


class TrainingRunCallback(Checkpoint, neutral.StopOutcome):  # type: ignore[misc]
    """Completion markers, save-and-stop on SIGTERM or save-now, progress. See the module doc.

    ``checkpoint_dir`` (default ``TRAININGRUN_CHECKPOINT_DIR``, else ./checkpoints) is the
    folder the sidecar watches: the stop save goes there, the save-now request is read there.
    """

    def __init__(self, checkpoint_dir: str | Path | None = None) -> None:
        self.folder = Path(checkpoint_dir) if checkpoint_dir else neutral.checkpoint_dir()
        self._stop = neutral.StopRequest(self.folder, install=False)  # Lightning catches SIGTERM
        self.stop_reason: str | None = None  # why training was asked to stop early, if it was
        self.finished = False  # reached max_steps
        self._marked: set[Path] = set()
        self._dirs = {self.folder}  # where saves are looked for: the checkpoint callbacks' too
        # SIGTERM: Lightning's handler, while ours stands in front of it (one process only).
        self._lightning_sigterm: Any = None
        self._wrapped = False
        self._past_check = False  # this batch end's stop check is done
        self._held: tuple[int, FrameType | None] | None = None
        self._total: int | None = None  # the fit's steps, when Lightning knows them

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        order = trainer.callbacks
        late = [c for c in order[order.index(self) + 1 :] if isinstance(c, ModelCheckpoint)]
        if late:
            raise ValueError(
                "TrainingRunCallback is listed before a ModelCheckpoint: list it after every "
                "ModelCheckpoint in Trainer(callbacks=[...]), so it sees their saves of a step "
                "before it saves that step itself"
            )
        self._dirs = self._folders(trainer)  # their dirpath is resolved by now (their setup)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._total = total_steps(trainer)
        # Lightning stops a SIGTERMed fit at the end of the batch, after the callbacks: a SIGTERM
        # that lands after this callback's stop check of that batch end would end the run
        # without the save. Such a signal is held and handed to Lightning at the next batch's
        # start, whose end saves. Under torch.distributed Lightning's handler talks to the
        # other ranks, so it is left alone there.
        if trainer.world_size == 1 and threading.current_thread() is threading.main_thread():
            self._lightning_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._wrapped = True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._past_check:
            self._held = (signum, frame)
        else:
            self._pass_on(signum, frame)

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        handler = self._lightning_sigterm
        if callable(handler):
            handler(signum, frame)

    def _unwrap(self) -> None:
        if self._wrapped:
            signal.signal(signal.SIGTERM, self._lightning_sigterm)
            self._wrapped = False

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._past_check = False
        if self._held is not None:
            held, self._held = self._held, None
            self._pass_on(*held)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._unwrap()

    def _folders(self, trainer: pl.Trainer) -> set[Path]:
        """The sidecar's folder and the checkpoint callbacks' folders within it."""
        root = self.folder.resolve()
        found = {self.folder}
        for c in trainer.checkpoint_callbacks:
            dirpath = getattr(c, "dirpath", None)
            if dirpath and Path(dirpath).resolve().is_relative_to(root):
                found.add(Path(dirpath))
        return found

    def _saved_at(self, step: int) -> list[Path]:
        """The ``.ckpt`` files of ``step`` in those folders (top level only: a listing per step)."""
        out = []
        for folder in self._dirs:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            out += [
                folder / n
                for n in names
                if n.endswith(".ckpt") and lightning_step(n) == step and (folder / n).is_file()
            ]
        return out

    def _mark_saved(self, trainer: pl.Trainer) -> None:
        """Marks the files saved at this step complete: Lightning's save ends with a barrier,
        and the file is written by global rank zero; a node's local rank zero marks it."""
        if trainer.local_rank != 0:
            return
        for path in self._saved_at(trainer.global_step):
            if path not in self._marked:
                local.mark_complete(path)
                self._marked.add(path)

    def _asked(self, trainer: pl.Trainer) -> str | None:
        reason = neutral.SIGTERM_REASON if trainer.received_sigterm else self._stop.reason()
        if trainer.world_size > 1:
            # A collective at every batch end of every rank: a rank saving alone would wait
            # forever in the save's barrier.
            anyone = trainer.strategy.reduce_boolean_decision(reason is not None, all=False)
            if anyone and reason is None:
                reason = neutral.PEER_STOP
        return reason

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        self._mark_saved(trainer)
        self._past_check = True  # a SIGTERM from here waits for on_train_batch_start
        reason = self._asked(trainer)
        if reason is None and self._held is not None:
            reason = neutral.SIGTERM_REASON
        self.finished = trainer.max_steps > 0 and step >= trainer.max_steps
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
            self._save(trainer, reason)
            trainer.should_stop = True
        if trainer.is_global_zero:
            local.write_progress(self.folder, local.Progress(step, self._total))

    def _save(self, trainer: pl.Trainer, reason: str) -> None:
        """Saves this step unless a checkpoint callback did; every rank takes the same branch
        (global rank zero, which writes the files, decides)."""
        step = trainer.global_step
        saved = bool(self._saved_at(step))
        if trainer.world_size > 1:
            saved = bool(trainer.strategy.broadcast(saved, src=0))
        if saved:
            log.warning("%s: step %d is saved; stopping", reason, step)
            return
        path = self.folder / STOP_FILENAME.format(epoch=trainer.current_epoch, step=step)
        log.warning("%s: saving %s and stopping", reason, path)
        trainer.save_checkpoint(path)
        self._mark_saved(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark_saved(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark_saved(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._unwrap()
        self._mark_saved(trainer)
        self.finished = trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
        self.log_stopped(log, f"step {trainer.global_step}")


def total_steps(trainer: pl.Trainer) -> int | None:
    """The fit's optimizer steps: max_steps when set, else Lightning's estimate from the epochs
    and the data (None when it has none: an iterable dataset of unknown length)."""
    if trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        estimate = float(trainer.estimated_stepping_batches)
    except Exception:  # Lightning raises what its data loaders raise
        return None
    return int(estimate) if 0 < estimate < float("inf") else None


def fit(trainer: pl.Trainer, model: pl.LightningModule, *args: Any, **kwargs: Any) -> int:
    """``trainer.fit``, resumed from the restored checkpoint when there is one (unless
    ``ckpt_path`` is given); returns the exit code: 0 when training finished, ``EXIT_STOPPED``
    when it stopped early to be resumed. The trainer must have a ``TrainingRunCallback``."""
    callback = next((c for c in trainer.callbacks if isinstance(c, TrainingRunCallback)), None)
    if callback is None:
        raise ValueError(
            "add trainingrun.integrations.lightning.TrainingRunCallback() to Trainer(callbacks=...)"
        )
    if "ckpt_path" not in kwargs:
        resume = neutral.resume_from()
        kwargs["ckpt_path"] = str(resume) if resume else None
    try:
        trainer.fit(model, *args, **kwargs)
    except SIGTERMException:
        # Lightning's stop after SIGTERM; the callback saved at the step end first.
        return 0 if callback.finished else EXIT_STOPPED
    return callback.exit_code
