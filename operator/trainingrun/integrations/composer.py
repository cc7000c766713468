"""MosaicML Composer integration: ``trainingrun.integrations.composer``.

In a training script whose ``Trainer`` saves into the checkpoint folder::

    from trainingrun.integrations import composer as tr

    callback = tr.TrainingRunCallback()
    trainer = Trainer(
        ...,
        callbacks=[callback],
        save_folder=str(tr.checkpoint_dir()),
        save_interval="500ba",
        save_overwrite=True,          # the folder may hold checkpoints newer than the resumed one
        load_path=tr.resume_path(),   # the restored checkpoint, or None on a fresh start
    )
    code = tr.fit(trainer)            # 0 only when training is done
    trainer.close()
    sys.exit(code)

The callback:

- turns SIGTERM or the sidecar's save-now request (a preemption notice) into a stop at the next
  batch end (``state.stop_training()``): Composer's ``CheckpointSaver`` then saves that batch,
  as the end of training (``ep{E}-ba{B}-rank{R}.pt``), and points ``latest-rank{R}.pt`` at it,
  which is what tells the sidecar the file is whole. Under torch.distributed the ranks decide
  together (any rank asked: all stop at the same batch);
- catches SIGTERM from the fit's start to its end (Composer installs no handler of its own, so
  without it SIGTERM ends the process at once and the steps since the last save are lost);
- writes progress (batch, max batches) for the sidecar to publish.

A resume continues to the ``max_duration`` the Trainer was given: Composer takes it from the
Trainer's arguments, not from the checkpoint, whose ``max_duration`` the stop had shortened.

A resume from the checkpoint of the last batch (the attempt stopped after its final save, before
it exited) trains nothing: ``fit`` returns 0 with the weights loaded, where Composer's own
``Trainer.fit`` raises (no training would occur).

Exit code: ``fit`` returns ``EXIT_STOPPED`` (143) after an early stop: the operator takes a
trainer's exit 0 for a finished run.

Only training scripts import this module (it needs ``mosaicml``); the operator never does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from composer import Callback, Logger, State
from composer.core import TimeUnit
from composer.utils import dist

from trainingrun.checkpoint import local
from trainingrun.contract import EXIT_STOPPED
from trainingrun.integrations import trainer as neutral

__all__ = ["EXIT_STOPPED", "TrainingRunCallback", "checkpoint_dir", "fit", "resume_path"]

log = logging.getLogger("trainingrun.integrations.composer")

checkpoint_dir = neutral.checkpoint_dir


def resume_path() -> str | None:
    """The restored ``.pt`` file (or sharded folder) for ``Trainer(load_path=...)``, or None."""
    path = neutral.resume_from()
    return str(path) if path else None


def _any_rank(flag: bool, state: State) -> bool:
    """Whether ``flag`` is set on any rank: a collective every rank calls at the same batch end."""
    value = state.device.tensor_to_device(torch.tensor([int(flag)], dtype=torch.int32))
    dist.all_reduce(value, reduce_operation="MAX")
    return bool(value.item())


def _max_batches(state: State) -> int | None:
    """The max batches, or None when max_duration is not in batches."""
    if state.max_duration is not None and state.max_duration.unit == TimeUnit.BATCH:
        return int(state.max_duration.value)
    return None


class TrainingRunCallback(Callback, neutral.StopOutcome):  # type: ignore[misc]
    """Save-and-stop on SIGTERM or save-now, progress. See the module doc.

    ``checkpoint_dir`` (default ``TRAININGRUN_CHECKPOINT_DIR``, else ./checkpoints) is where the
    save-now request is read and progress is written.
    """

    def __init__(self, checkpoint_dir: str | Path | None = None) -> None:
        self.folder = Path(checkpoint_dir) if checkpoint_dir else neutral.checkpoint_dir()
        self._stop = neutral.StopRequest(self.folder, install=False)
        self.stop_reason: str | None = None  # why training was asked to stop early, if it was
        self.finished = False  # the stop came at the last batch: nothing was cut short
        self._total: int | None = None  # max batches as the fit began (the stop shortens it)
        self._samples, self._tokens = neutral.Throughput(), neutral.Throughput()

    def fit_start(self, state: State, logger: Logger) -> None:
        self._total = _max_batches(state)
        self._stop.install()

    def batch_end(self, state: State, logger: Logger) -> None:
        done, total = int(state.timestamp.batch), self._total
        reason = self._stop.reason()
        if dist.get_world_size() > 1 and _any_rank(reason is not None, state) and reason is None:
            reason = neutral.PEER_STOP
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
            self.finished = total is not None and done >= total
            log.warning("%s: saving batch %d and stopping", reason, done)
            state.stop_training()  # CheckpointSaver saves this batch as the end of training
        if dist.get_global_rank() == 0:
            stamp = state.timestamp
            samples = self._samples.rate(int(stamp.sample))
            tokens = self._tokens.rate(int(stamp.token))
            local.write_progress(self.folder, local.Progress(done, total, samples, tokens))

    def fit_end(self, state: State, logger: Logger) -> None:
        self._stop.restore()
        self.log_stopped(log, f"batch {int(state.timestamp.batch)}")

    def close(self, state: State, logger: Logger) -> None:
        self._stop.restore()  # also when fit raised


def fit(trainer: Any) -> int:
    """``trainer.fit()`` (a ``composer.Trainer`` with a ``TrainingRunCallback``); returns the exit
    code: 0 when training finished, ``EXIT_STOPPED`` when it stopped early to be resumed."""
    state = trainer.state
    callback = next((c for c in state.callbacks if isinstance(c, TrainingRunCallback)), None)
    if callback is None:
        raise ValueError(
            "add trainingrun.integrations.composer.TrainingRunCallback() to Trainer(callbacks=...)"
        )
    total, done = _max_batches(state), int(state.timestamp.batch)
    if total is not None and done >= total:
        log.info("the restored checkpoint is at batch %d of %d: training is done", done, total)
        return 0
    trainer.fit()
    return callback.exit_code
