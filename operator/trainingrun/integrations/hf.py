"""HuggingFace Trainer integration: ``trainingrun.integrations.hf``.

One line in a training script::

    from trainingrun.integrations import hf
    sys.exit(hf.train(trainer))      # resumes, saves on preemption, exits 0 only when done

or, keeping control of ``trainer.train``::

    callback = hf.attach(trainer)
    trainer.train(resume_from_checkpoint=hf.resume_checkpoint())
    sys.exit(callback.exit_code)

The callback:

- marks each saved ``checkpoint-<step>/`` complete once the Trainer has written every file of it
  (``on_save`` runs after ``_save_checkpoint``, which writes ``trainer_state.json`` last), so the
  sync sidecar uploads it at once instead of waiting for a quiet period;
- turns SIGTERM, or the sidecar's save-now request (a preemption notice), into a save at the next
  step end followed by a stop. Its SIGTERM handler is installed at train begin and the previous
  one put back at train end, so outside ``trainer.train`` SIGTERM ends the process as before;
- writes progress (step, max steps) for the sidecar to publish.

Multi-node (torch.distributed with more than one process, e.g. ``torchrun`` with one process per
node, each node with its own checkpoint folder and sync sidecar): SIGTERM reaches one pod only and
a notice reaches the sidecars at different moments, so the stop is decided together. At each step
end the ranks all_reduce (MAX) a one-element flag, and every rank saves the same
``checkpoint-<step>`` and stops after it; a rank saving alone would wait forever in the save's
collectives. Each node's local process zero marks its node's folder complete after a barrier, once
every process has written its files there: with the Trainer's defaults node 0's folder holds the
model, optimizer, scheduler, ``trainer_state.json`` and ``rng_state_0.pth``, another node's only
its ranks' ``rng_state_<rank>.pth``, that node's part of the checkpoint. A node whose folder was
not created is not marked. Progress is written by world process zero only. Under ``torchrun``
the container exits with torchrun's code: 1 after an early stop, not the worker's 143.

Exit code: a run stopped early exits ``EXIT_STOPPED`` (143, as if SIGTERM had ended it), never 0.
The operator counts a trainer exit 0 as success before anything else, so an early stop reported
as 0 would end a half-trained run as Succeeded; with 143 the attempt is classified by what
stopped it (the notice, the pod's DisruptionTarget, the node) and resumed.

A resume from the checkpoint of the last step (``max_steps``: the attempt stopped after its
final save, before it exited) trains nothing: ``hf.train`` loads its weights and returns 0. The
Trainer itself, resumed there, would train one step past ``max_steps``.

``resume_checkpoint()`` is the folder the restore put in place (``TRAININGRUN_RESUME_FROM``), or
None on a fresh start. The restore writes into ``TRAININGRUN_CHECKPOINT_DIR``; with that as the
Trainer's ``output_dir``, ``trainer.train(resume_from_checkpoint=True)`` finds it too, but only on
a resumed attempt: on the first one the Trainer raises, as there is no checkpoint yet.

Only training scripts import this module (it needs the ``hf`` extra); the operator, the sidecar
and the restore never do.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainingrun.checkpoint import local
from trainingrun.contract import ENV_CHECKPOINT_DIR, EXIT_STOPPED, checkpoint_dirname
from trainingrun.integrations.trainer import (
    PEER_STOP,
    StopOutcome,
    StopRequest,
    Throughput,
    resume_from,
)

__all__ = [
    "EXIT_STOPPED",
    "PEER_STOP",
    "TrainingRunCallback",
    "attach",
    "checkpoint_step",
    "resume_checkpoint",
    "train",
    "world_size",
]

log = logging.getLogger("trainingrun.integrations.hf")

# Backends that reduce CPU tensors; the others (NCCL and the like) only the rank's device's.
_CPU_BACKENDS = ("gloo", "mpi")


def world_size() -> int:
    """The number of processes of the torch.distributed job, 1 outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def reduce_device(args: TrainingArguments) -> torch.device:
    """Where the ranks' flags are reduced: the CPU for gloo, else the rank's device."""
    backend = str(dist.get_backend())
    return torch.device("cpu") if any(b in backend for b in _CPU_BACKENDS) else args.device


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is set on any rank: one one-element all_reduce MAX on ``device``. A
    collective: every rank calls it at the same point."""
    value = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def resume_checkpoint() -> str | None:
    """The restored checkpoint folder to resume from, or None on a fresh start."""
    path = resume_from(folder=True)
    return str(path) if path else None


class TrainingRunCallback(TrainerCallback, StopOutcome):
    """Completion markers, save-and-stop on SIGTERM or save-now, progress. See the module doc.

    ``checkpoint_dir`` (default ``TRAININGRUN_CHECKPOINT_DIR``, else the Trainer's
    ``output_dir``) is where the save-now request is read and progress is written.
    """

    def __init__(self, checkpoint_dir: str | Path | None = None) -> None:
        configured = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR) or None
        self.checkpoint_dir = Path(configured) if configured else None
        self.stop_reason: str | None = None  # why training was asked to stop early, if it was
        self.finished = False  # reached max_steps
        # Its folder is only the default: the save-now request is read from _folder(args).
        self._stop = StopRequest(self.checkpoint_dir, install=False)
        self._samples = Throughput()
        # The Trainer saves between on_step_end and on_save: the time between the two, summed,
        # is the time training stood still for saves (the goodput ledger's checkpoint stall).
        self._step_end: float | None = None
        self.save_seconds = 0.0

    def _folder(self, args: TrainingArguments) -> Path:
        return self.checkpoint_dir or Path(str(args.output_dir))

    def restore_signal_handler(self) -> None:
        """Puts back the SIGTERM handler found at train begin."""
        self._stop.restore()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._stop.install()  # a no-op outside the main thread (Python's rule)
        if state.is_world_process_zero:
            local.write_progress(self._folder(args), self._progress(args, state))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> TrainerControl:
        folder = self._folder(args)
        # Checked before progress is written: whoever reads step N and then asks for a save
        # gets checkpoint-(N+1), never N.
        reason = self._stop.reason(folder)
        asked = reason is not None or self.stop_reason is not None
        # Every rank reaches every step end, so the all_reduce lines up; only under
        # torch.distributed, where a rank must not stop (or save) alone.
        if world_size() > 1 and any_rank(asked, reduce_device(args)) and not asked:
            reason = PEER_STOP
        if reason and self.stop_reason is None:
            self.stop_reason = reason
            log.warning("%s: saving checkpoint-%d and stopping", reason, state.global_step)
        if self.stop_reason is not None:
            control.should_save = True
            control.should_training_stop = True
        if state.is_world_process_zero:
            local.write_progress(folder, self._progress(args, state))
        self._step_end = time.monotonic()
        return control

    def _progress(self, args: TrainingArguments, state: TrainerState) -> local.Progress:
        """The step, of max_steps, and the samples per second since this process began (a
        step takes train_batch_size x gradient_accumulation_steps on each process)."""
        per_step = args.train_batch_size * args.gradient_accumulation_steps * args.world_size
        rate = self._samples.rate(state.global_step * per_step)
        total = state.max_steps if state.max_steps > 0 else None
        return local.Progress(
            state.global_step, total, samples_per_second=rate, save_seconds=self.save_seconds
        )

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if world_size() > 1:
            # _save_checkpoint has no barrier after the rng states: each process writes its
            # rng_state_<rank>.pth (process zero the rest first) and goes on to on_save. The
            # barrier makes the marker below follow every file of every process of the node.
            # Every rank saves at the same steps (save_steps, the stop decided together).
            dist.barrier()
        if self._step_end is not None:
            self.save_seconds += time.monotonic() - self._step_end
            self._step_end = None
        if state.is_world_process_zero:  # the save's time, also when training stops here
            local.write_progress(self._folder(args), self._progress(args, state))
        if not state.is_local_process_zero:
            return  # the processes of a node share its folder: one marks it
        folder = Path(str(args.output_dir)) / checkpoint_dirname(state.global_step)
        if folder.is_dir():
            local.mark_complete(folder)
        else:
            log.warning("saved, but %s is not a folder: not marked complete", folder)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.finished = state.max_steps > 0 and state.global_step >= state.max_steps
        self.restore_signal_handler()
        self.log_stopped(log, f"step {state.global_step}")


def attach(trainer: Any, checkpoint_dir: str | Path | None = None) -> TrainingRunCallback:
    """Adds the callback to ``trainer`` (a ``transformers.Trainer``) and returns it."""
    callback = TrainingRunCallback(checkpoint_dir)
    trainer.add_callback(callback)
    return callback


def checkpoint_step(checkpoint: str | Path) -> int | None:
    """The global step a Trainer checkpoint folder was saved at (its trainer_state.json)."""
    try:
        state = json.loads((Path(checkpoint) / local.TRAINER_STATE).read_text())
        return int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def train(trainer: Any, checkpoint_dir: str | Path | None = None) -> int:
    """Trains, resuming from the restored checkpoint if any; returns the process exit code:
    0 when training finished, ``EXIT_STOPPED`` when it stopped early to be preempted."""
    resume = resume_checkpoint()
    step = checkpoint_step(resume) if resume else None
    max_steps = int(getattr(trainer.args, "max_steps", -1) or -1)
    if resume and step is not None and 0 < max_steps <= step:
        # The checkpoint is the end of training (the attempt stopped after its last save, before
        # it exited). The Trainer resumed there would train one step more than max_steps; load
        # the weights instead, so what follows sees the model an uninterrupted run ends with.
        log.info(
            "%s is at step %d of %d: training is done; loading its weights", resume, step, max_steps
        )
        trainer._load_from_checkpoint(resume)
        return 0
    callback = attach(trainer, checkpoint_dir)
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        callback.restore_signal_handler()  # also when training raised
    return callback.exit_code
