"""A runnable fine-tuning script for a TrainingRun: a tiny GPT-2 built from a config (nothing is
downloaded), trained with the HuggingFace Trainer on a small text corpus made here, on CPU.

    python examples/finetune.py --max-steps 60 --save-steps 10

It uses ``trainingrun.hf``: resumes from the checkpoint the restore put in place, saves at the
next step end on SIGTERM or a preemption notice, and marks each checkpoint complete for the
sync sidecar. Deterministic: the same arguments give bitwise the same weights whether or not the
run was interrupted and resumed.

Output: checkpoints in ``$TRAININGRUN_CHECKPOINT_DIR`` (default ./checkpoints), one JSON line
per step with its loss in ``--loss-log`` (when given), and the final checkpoint at
``checkpoint-<max steps>/`` (``model.safetensors``).
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

from trainingrun import hf

WORDS = [
    "the",
    "model",
    "keeps",
    "its",
    "weights",
    "safe",
    "in",
    "the",
    "bucket",
    "while",
    "spot",
    "nodes",
    "come",
    "and",
    "go",
    "and",
    "every",
    "checkpoint",
    "is",
    "verified",
    "before",
    "a",
    "resume",
    "so",
    "no",
    "step",
    "is",
    "lost",
]


class Corpus(torch.utils.data.Dataset):  # type: ignore[misc]
    """Byte-level token sequences of pseudo-random sentences, fixed by the seed."""

    def __init__(self, size: int, length: int, seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - data, not secrets
        self.items = []
        for _ in range(size):
            text = " ".join(rng.choice(WORDS) for _ in range(length)).encode()[:length]
            ids = torch.tensor(list(text.ljust(length, b" ")), dtype=torch.long)
            self.items.append({"input_ids": ids, "labels": ids.clone()})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


class StepLog(TrainerCallback):  # type: ignore[misc]
    """One JSON line per optimizer step with its loss; optionally slows steps down (tests use
    it to give a preemption time to land between saves)."""

    def __init__(self, path: Path | None, delay: float) -> None:
        self.path = path
        self.delay = delay

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if self.path and logs and "loss" in logs:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.delay:
            time.sleep(self.delay)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--loss-log", type=Path, help="append one JSON line per step here")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    output = os.environ.get("TRAININGRUN_CHECKPOINT_DIR", "checkpoints")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # bitwise-stable CPU kernels
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
        output_dir=output,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_strategy="steps",
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=1,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Corpus(size=512, length=64, seed=args.seed),
        callbacks=[StepLog(args.loss_log, args.step_delay)],
    )
    if os.environ.get("RESUME_FROM_OUTPUT_DIR"):  # the Trainer's own resume, as a user may write
        callback = hf.attach(trainer)
        trainer.train(resume_from_checkpoint=True)
        return hf.EXIT_STOPPED if callback.stop_reason else 0
    return hf.train(trainer)


if __name__ == "__main__":
    sys.exit(main())
