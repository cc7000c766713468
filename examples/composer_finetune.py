"""A runnable training script for a TrainingRun on MosaicML Composer: a small MLP classifier built
from a config and trained on CPU, single process, on a synthetic data set made from a fixed seed
(the task is examples/tinytask.py, shared with the other framework's example). Nothing is
downloaded.

    python examples/composer_finetune.py --max-steps 60 --save-steps 10

It runs in the Composer stack's virtualenv (``make composer-env``, requirements/composer.txt)
with ``PYTHONPATH=<clone>/operator``: trainingrun is imported from the clone, not installed.

Checkpoints are Composer's own: the Trainer's ``CheckpointSaver`` saves every ``--save-steps``
batches (and at the end of training) to ``$TRAININGRUN_CHECKPOINT_DIR/ep{E}-ba{B}-rank0.pt``
(default folder ./checkpoints), keeps them all, and points the symlink ``latest-rank0.pt`` at the
newest; ``$TRAININGRUN_RESUME_FROM``, when set and not empty, names the ``.pt`` file to resume
from (``load_path``). Once training finished, the final weights are in ``final/weights.bin``:
the raw bytes of every tensor of the state dict, in sorted key order. With ``--loss-log FILE``
(``-`` for stdout), one JSON line per optimizer step: ``{"step": 12, "loss": 2.07...}``.
Every option also reads a ``FINETUNE_*`` variable (``--step-delay`` <- ``FINETUNE_STEP_DELAY``).

Deterministic: the same arguments give bitwise the same final weights and losses whether or not
the run was stopped after a checkpoint and resumed from it. The data order of each epoch comes
from a seeded ``DistributedSampler`` (``set_epoch`` per epoch); on resume Composer replays the
sampler to the checkpoint's epoch and skips the batches of that epoch already trained
(``spin_dataloaders``), and restores the random generators' state saved in the checkpoint.

``trainingrun.integrations.composer`` turns SIGTERM or a preemption notice into a stop at the end
of the
batch under way; Composer saves that batch as the end of training and the script exits 143, so
the operator resumes it from that file.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from composer import Callback, Logger, State, Trainer
from composer.models import ComposerModel
from composer.utils import dist, reproducibility
from tinytask import log_step, make_dataset, make_model, parse_args, save_final
from torch import nn
from torch.utils.data import DataLoader

from trainingrun.integrations import composer as tr


class Classifier(ComposerModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()

    def forward(self, batch: Any) -> torch.Tensor:
        x, _ = batch
        return self.net(x)

    def loss(self, outputs: Any, batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        _, y = batch
        return nn.functional.cross_entropy(outputs, y)


class StepLog(Callback):
    """One JSON line per optimizer step with its loss; optionally slows each step down (tests
    use it to give a preemption time to land between saves). Event.BATCH_END runs before
    Event.BATCH_CHECKPOINT, where Composer saves: the line of step S is written before the
    checkpoint of step S."""

    def __init__(self, path: Path | None, delay: float) -> None:
        self.path = path
        self.delay = delay

    def batch_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() == 0:
            loss = state.loss
            if isinstance(loss, dict):
                loss = loss["total"]
            log_step(self.path, int(state.timestamp.batch), float(loss))
        if self.delay:
            time.sleep(self.delay)


def main(argv: list[str] | None = None) -> int:
    args = parse_args((__doc__ or "").split("\n\n")[0], argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    output = tr.checkpoint_dir()
    # Bitwise-repeatable CPU training: deterministic kernels, one thread. The Trainer seeds
    # again, but only after the model is built: seed here first.
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    reproducibility.seed_all(args.seed)
    model = Classifier()
    data = make_dataset(args.seed)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        sampler=dist.get_sampler(data, shuffle=True, seed=args.seed),
    )
    stop = tr.TrainingRunCallback()  # SIGTERM or a preemption notice: save this batch, stop
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # Linear decay to 0 over max_steps, stepped per batch.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, 1.0 - step / args.max_steps)
    )
    trainer = Trainer(
        model=model,
        train_dataloader=loader,
        optimizers=optimizer,
        schedulers=schedule,
        step_schedulers_every_batch=True,
        max_duration=f"{args.max_steps}ba",
        device="cpu",
        seed=args.seed,
        deterministic_mode=True,
        run_name="composer-finetune",  # else a random name
        progress_bar=False,
        log_to_console=False,
        callbacks=[StepLog(args.loss_log, args.step_delay), stop],
        save_folder=str(output),
        save_interval=f"{args.save_steps}ba",
        save_num_checkpoints_to_keep=-1,  # keep every one: the operator's keep policy prunes
        # A folder may hold checkpoints newer than the one resumed from (a trainer restarted in
        # the same pod, a restore of an older step): the default refuses to start then.
        save_overwrite=True,
        load_path=tr.resume_path(),  # the restored file, or None on a fresh start
    )
    code = tr.fit(trainer)  # trains from the restored file's batch on
    trainer.close()
    if code != 0:
        return code  # stopped early after saving: 143, the operator resumes it
    path = save_final(model.net, output / "final")
    logging.getLogger("composer_finetune").info("final weights in %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
