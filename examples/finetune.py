"""A runnable fine-tuning script for a TrainingRun: a tiny GPT-2 built from a config and trained
with the HuggingFace Trainer on CPU, on a small corpus made here. Nothing is downloaded: the
tokenizer is the identity on UTF-8 bytes (vocabulary of 256).

    python examples/finetune.py --max-steps 60 --save-steps 10

It uses ``trainingrun.integrations.hf``: resumes from the checkpoint the restore put in place,
saves at the
next step end on SIGTERM or a preemption notice (then exits 143), and marks each checkpoint
complete for the sync sidecar. Deterministic: the same arguments give bitwise the same weights
and losses whether or not the run was stopped and resumed.

Output, under ``$TRAININGRUN_CHECKPOINT_DIR`` (default ./checkpoints): ``checkpoint-<step>/``
folders, and once training finished the final weights in ``final/model.safetensors``. With
``--loss-log FILE`` (``-`` for stdout), one JSON line per optimizer step:
``{"step": 12, "loss": 5.41...}``.
Every option also reads a ``FINETUNE_*`` variable (``--step-delay`` <- ``FINETUNE_STEP_DELAY``).

It runs unchanged under ``torchrun`` (DDP over gloo on CPU, e.g. 2 nodes x 1 process, each node
with its own checkpoint folder): the loss log and the final weights come from rank 0 only, and two
runs with the same arguments and world size give bitwise the same weights, stopped and resumed or
not (``tests/e2e/ddp_check.py``). The batch size is per process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from trainingrun.integrations import hf

WORDS = (  # noqa: SIM905 - a sentence reads better than a list of words
    "the model keeps its weights safe in a bucket while spot nodes come and go every checkpoint"
    " is verified before a resume so no step is lost when the cluster takes a node back"
).split()


def encode(text: str, length: int) -> list[int]:
    """The tokenizer: UTF-8 bytes, cut or padded with spaces to ``length``."""
    return list(text.encode()[:length].ljust(length, b" "))


class Corpus(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Pseudo-random sentences as byte tokens, fixed by the seed."""

    def __init__(self, size: int, length: int, seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - data, not secrets
        self.items = []
        for _ in range(size):
            ids = torch.tensor(encode(" ".join(rng.choices(WORDS, k=length)), length))
            self.items.append({"input_ids": ids, "labels": ids.clone()})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


class StepLog(TrainerCallback):
    """One JSON line per optimizer step with its loss; optionally slows each step down (tests
    use it to give a preemption time to land between saves)."""

    def __init__(self, path: Path | None, delay: float) -> None:
        self.path = path
        self.delay = delay

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        # Every rank logs the same loss (averaged over the ranks): one writes it.
        if not (state.is_world_process_zero and self.path and logs and "loss" in logs):
            return
        line = json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n"
        if str(self.path) == "-":
            sys.stdout.write(line)
            sys.stdout.flush()
        else:
            with self.path.open("a") as f:
                f.write(line)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.delay:
            time.sleep(self.delay)


def env_default(name: str, default: str) -> str:
    return os.environ.get(f"FINETUNE_{name}", default)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=int(env_default("MAX_STEPS", "60")))
    parser.add_argument("--save-steps", type=int, default=int(env_default("SAVE_STEPS", "10")))
    parser.add_argument("--batch-size", type=int, default=int(env_default("BATCH_SIZE", "8")))
    parser.add_argument("--seed", type=int, default=int(env_default("SEED", "42")))
    parser.add_argument(
        "--step-delay",
        type=float,
        default=float(env_default("STEP_DELAY", "0")),
        help="seconds to sleep after each step (makes room for a preemption in tests)",
    )
    parser.add_argument(
        "--save-total-limit",
        type=int,
        default=int(env_default("SAVE_TOTAL_LIMIT", "0")) or None,
        help="keep this many checkpoints, deleting older ones as the Trainer rotates them",
    )
    parser.add_argument(
        "--loss-log",
        type=Path,
        default=env_default("LOSS_LOG", "") or None,
        help="append one JSON line per step here (- for stdout)",
    )
    parser.add_argument(
        "--resume",
        choices=["trainingrun", "output-dir"],
        default=env_default("RESUME", "trainingrun"),
        help="trainingrun: from TRAININGRUN_RESUME_FROM (hf.train); output-dir: the Trainer's "
        "own resume_from_checkpoint=True, which needs a checkpoint in the output folder",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    output = Path(os.environ.get("TRAININGRUN_CHECKPOINT_DIR") or "checkpoints")

    # Bitwise-repeatable CPU training: deterministic kernels, one thread.
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    set_seed(args.seed)
    config = GPT2Config(
        vocab_size=256,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=str(output),
        max_steps=args.max_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=1,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        # Under torchrun (WORLD_SIZE > 1): DDP over gloo, the CPU backend, whatever else torch was
        # built with (accelerate would take MPI when available).
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Corpus(size=512, length=64, seed=args.seed),
        callbacks=[StepLog(args.loss_log, args.step_delay)],
    )
    if args.resume == "output-dir":
        callback = hf.attach(trainer)
        trainer.train(resume_from_checkpoint=True)
        code = callback.exit_code
    else:
        code = hf.train(trainer)
    if code == 0:
        trainer.save_model(str(output / "final"))  # by world process zero only (should_save)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # A gloo group still alive at interpreter exit can abort the process after training
        # ended ("terminate called without an active exception", exit -6): leave it first.
        torch.distributed.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
