"""A runnable training script for a TrainingRun on PyTorch Lightning: a small MLP classifier built
from a config and trained on CPU, single process, on a synthetic data set made from a fixed seed
(the task is examples/tinytask.py, shared with the other framework's example). Nothing is
downloaded.

    python examples/lightning_finetune.py --max-steps 60 --save-steps 10

It runs in the Lightning stack's virtualenv (``make lightning-env``, requirements/lightning.txt)
with ``PYTHONPATH=<clone>/operator``: trainingrun is imported from the clone, not installed.

Checkpoints are Lightning's own: ``ModelCheckpoint`` saves every ``--save-steps`` optimizer steps
to ``$TRAININGRUN_CHECKPOINT_DIR/epoch=E-step=S.ckpt`` (default folder ./checkpoints) and keeps
them all; ``$TRAININGRUN_RESUME_FROM``, when set and not empty, names the ``.ckpt`` file to
resume from (``trainer.fit(ckpt_path=...)``). Once training finished, the final weights are in
``final/weights.bin``: the raw bytes of every tensor of the state dict, in sorted key order.
With ``--loss-log FILE`` (``-`` for stdout), one JSON line per optimizer step:
``{"step": 12, "loss": 2.07...}``.
Every option also reads a ``FINETUNE_*`` variable (``--step-delay`` <- ``FINETUNE_STEP_DELAY``).

Deterministic: the same arguments give bitwise the same final weights and losses whether or not
the run was stopped after a checkpoint and resumed from it. No step uses the global random
generators after the model is built (no dropout), the data order of each epoch is a
permutation drawn from its own generator seeded by (seed, epoch), and the loader is resumable
(``state_dict``/``load_state_dict``): Lightning stores its position in the checkpoint, so a
resume in the middle of an epoch goes on with the next batch of that epoch instead of starting
the epoch over.

``trainingrun.integrations.lightning`` resumes from the restored checkpoint and, on SIGTERM or a
preemption
notice, saves ``epoch=E-step=S.ckpt`` at the end of the step under way and stops: the script
then exits 143, so the operator resumes it from that file.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from tinytask import log_step, make_dataset, make_model, parse_args, save_final
from torch import nn
from torch.utils.data import DataLoader, Sampler

from trainingrun.integrations import lightning as tr


class EpochSampler(Sampler[int]):
    """A new permutation each epoch, drawn from a generator seeded by (seed, epoch), that can
    start in the middle of an epoch: the loader's state is (epoch, samples handed out)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.epoch = 0
        self.taken = 0  # samples of the current epoch handed out
        self.resume: tuple[int, int] | None = None  # (epoch, samples to skip) after a restore

    def set_epoch(self, epoch: int) -> None:  # Lightning calls it at each epoch start
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=g).tolist()
        start = 0
        if self.resume is not None and self.resume[0] == self.epoch:
            start = self.resume[1]
        self.resume = None
        self.taken = start
        for i in order[start:]:
            self.taken += 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]
        self.resume = (state["epoch"], state["taken"])


class ResumableLoader(DataLoader[Any]):
    """A DataLoader with ``state_dict``/``load_state_dict``, which makes Lightning save its
    position in each checkpoint and restore it on resume (fit_loop.py ``combined_loader``).
    A sized map-style loader is not prefetched by Lightning, and with no worker process the
    sampler has handed out exactly the samples of the batches trained so far."""

    def state_dict(self) -> dict[str, int]:
        assert isinstance(self.sampler, EpochSampler)
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        assert isinstance(self.sampler, EpochSampler)
        self.sampler.load_state_dict(state)


class Classifier(pl.LightningModule):
    def __init__(self, lr: float, max_steps: int) -> None:
        super().__init__()
        self.lr = lr
        self.max_steps = max_steps
        self.net = make_model()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        # Linear decay to 0 over max_steps, stepped per optimizer step.
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: max(0.0, 1.0 - step / self.max_steps)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class StepLog(Callback):
    """One JSON line per optimizer step with its loss; optionally slows each step down (tests
    use it to give a preemption time to land between saves). Lightning runs the other
    callbacks' on_train_batch_end before ModelCheckpoint's: the line of step S is written
    before the checkpoint of step S."""

    def __init__(self, path: Path | None, delay: float) -> None:
        self.path = path
        self.delay = delay

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.is_global_zero:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            log_step(self.path, trainer.global_step, float(loss))
        if self.delay:
            time.sleep(self.delay)


def main(argv: list[str] | None = None) -> int:
    args = parse_args((__doc__ or "").split("\n\n")[0], argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    output = tr.checkpoint_dir()
    # Bitwise-repeatable CPU training: deterministic kernels, one thread.
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, workers=True, verbose=False)
    model = Classifier(args.lr, args.max_steps)
    data = make_dataset(args.seed)
    loader = ResumableLoader(
        data, batch_size=args.batch_size, sampler=EpochSampler(len(data), args.seed)
    )
    checkpoints = ModelCheckpoint(
        dirpath=output,
        every_n_train_steps=args.save_steps,
        save_top_k=-1,  # keep every one: the operator's keep policy prunes
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        max_epochs=-1,
        # After the ModelCheckpoint: it saves at a stop request, marks every save complete.
        callbacks=[StepLog(args.loss_log, args.step_delay), checkpoints, tr.TrainingRunCallback()],
        default_root_dir=output,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        deterministic=True,
    )
    code = tr.fit(trainer, model, train_dataloaders=loader)  # resumes from the restored file
    if code != 0:
        return code  # stopped early (SIGTERM or a preemption notice) after saving: 143
    path = save_final(model.net, output / "final")
    logging.getLogger("lightning_finetune").info("final weights in %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
