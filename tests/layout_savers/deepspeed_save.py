"""Saves DeepSpeed checkpoints with the real library, on CPU, for the layout tests
(tests/e2e/test_real_layouts.py). It runs in the Lightning stack's virtualenv, which has DeepSpeed
(``make lightning-env``):

    python tests/layout_savers/deepspeed_save.py OUT [--stage N] [--steps K] [--bf16]
    torchrun --standalone --nproc_per_node 2 tests/layout_savers/deepspeed_save.py OUT --stage 2

A linear model trained with ZeRO stage N (0 to 3; ``--bf16`` for bf16 mixed precision) and
``engine.save_checkpoint(OUT)`` after each of K steps, with DeepSpeed's default tag
``global_step<N>``. Run alone it is a world of one (gloo backend, no launcher needed). At the end
``load_checkpoint(OUT)`` reads the newest save back, as a resumed run does.

``--journal FILE`` (rank 0) records, after each save, the tag and the modification times
(``st_mtime_ns``) of the files DeepSpeed rewrites at the top of OUT on every save (``latest`` and
the recovery scripts), so a test can replay the saves in the order they were written: the
files inside a tag folder are never rewritten, their own times tell their order.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

# DeepSpeed picks its accelerator when imported; a single process needs the variables of a
# world of one (torchrun sets them for each of its processes).
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29500")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("LOCAL_RANK", "0")

import deepspeed
import deepspeed.ops
import torch

# The CPU accelerator otherwise compiles a shared-memory all-reduce op with g++ on first use
# (about 25 s, cached in ~/.cache/torch_extensions); gloo does that job for a tiny model.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the save_dir of save_checkpoint")
    p.add_argument("--stage", type=int, default=1, choices=(0, 1, 2, 3), help="ZeRO stage")
    p.add_argument("--steps", type=int, default=2, help="steps, one save after each")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision")
    p.add_argument("--journal", type=Path, help="JSON lines: the top-level files' times per save")
    return p.parse_args()


def top_level_times(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(out.iterdir()) if p.is_file()}


def main() -> None:
    args = parse_args()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    config = {
        "train_batch_size": 2 * world,
        "train_micro_batch_size_per_gpu": 2,
        # torch's Adam: DeepSpeed's own CPU Adam is a C++ op compiled on first use.
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": args.stage},
        "bf16": {"enabled": args.bf16},
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    journal = []
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    for _ in range(args.steps):
        loss = engine(torch.randn(2, 4, dtype=dtype)).float().sum()
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(str(args.out))
        # save_checkpoint ends with a barrier: every rank's files of this tag are written.
        journal.append({"tag": f"global_step{engine.global_steps}", **top_level_times(args.out)})
    path, _ = engine.load_checkpoint(str(args.out))
    if rank == 0:
        if args.journal is not None:
            args.journal.write_text("".join(json.dumps(j) + "\n" for j in journal))
        print(f"deepspeed {deepspeed.__version__}: {args.steps} saves in {args.out}, read {path}")
    # Every rank ends its process group before it exits: one left to the interpreter's exit
    # aborted a rank now and then ("terminate called without an active exception", SIGABRT),
    # 1 run in 6 of two ranks under load.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
