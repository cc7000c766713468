"""Checkpoint saves as each framework's own source writes them, step by step, for the layout
tests: the files, in the order the library writes them, with its temporary names, renames,
symlinks and markers (the source of each fact is cited in trainingrun.checkpoint.layouts). A save
killed
half-way is any strict prefix of its operations.

Each ``Save`` also says what the layout rule must make of the whole save: the step, the files a
restore must put back, what the trainer resumes from, and the pointer files the restore writes.
``SAVES`` holds one save per format, ``CASES`` adds more of a format (DeepSpeed's ZeRO stages and
bf16). tests/e2e/test_real_layouts.py checks the DeepSpeed and MindFormers ones against the files
and operations of the real libraries.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

# (op, path, argument): ("write", path, bytes), ("rename", src, dst), ("link", path, target),
# ("remove", path, None), ("mkdir", path, None), ("chmod", path, mode). Paths are relative to
# the checkpoint folder.
Op = tuple[str, str, object]


@dataclass(frozen=True)
class Save:
    format: str
    step: int
    ops: list[Op]
    resume: str
    restored: dict[str, bytes]  # path -> bytes the restore puts back (data and pointers)
    extras: dict[str, str] = field(default_factory=dict)  # relative to the checkpoint folder


def data(name: str, step: int, size: int = 3000) -> bytes:
    """Distinct bytes per file and step, so a mix-up shows."""
    seed = f"{name}@{step}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def apply(folder: Path, ops: list[Op], mtime: float | None = None) -> None:
    """Carries out ``ops`` in ``folder``; ``mtime`` sets every written file's time."""
    for op, path, arg in ops:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if op == "write":
            assert isinstance(arg, bytes)
            target.write_bytes(arg)
            if mtime is not None:
                os.utime(target, (mtime, mtime))
        elif op == "rename":
            assert isinstance(arg, str)
            dest = folder / arg
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, dest)
        elif op == "link":
            assert isinstance(arg, str)
            if target.is_symlink():
                target.unlink()
            target.symlink_to(arg)
        elif op == "remove":
            target.unlink()
        elif op == "mkdir":
            target.mkdir(exist_ok=True)
        elif op == "chmod":
            assert isinstance(arg, int)
            target.chmod(arg)
        else:
            raise ValueError(op)


def _writes(files: dict[str, bytes]) -> list[Op]:
    return [("write", p, b) for p, b in files.items()]


def hf(step: int) -> Save:
    folder = f"checkpoint-{step}"
    files = {
        f"{folder}/{n}": data(n, step)
        for n in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")
    }
    files[f"{folder}/trainer_state.json"] = json.dumps({"global_step": step}).encode()
    return Save("hf", step, _writes(files), folder, files)


def lightning(step: int) -> Save:
    # ModelCheckpoint's file arrives by a move from the system temp folder; last.ckpt is a
    # relative link (save_last="link").
    name = f"lightning_logs/epoch=0-step={step}.ckpt"
    blob = data("ckpt", step, 9000)
    ops: list[Op] = [
        ("write", name, blob),
        ("link", "lightning_logs/last.ckpt", name.split("/")[1]),
    ]
    return Save("lightning", step, ops, name, {name: blob})


def composer(step: int) -> Save:
    name = f"ep0-ba{step}-rank0.pt"
    blob = data("composer", step, 9000)
    ops: list[Op] = [("write", name, blob), ("link", "latest-rank0.pt", name)]
    return Save("composer", step, ops, name, {name: blob})


def dcp(step: int) -> Save:
    folder = f"dcp/step_{step}"
    shards = {f"{folder}/__{r}_0.distcp": data(f"shard{r}", step) for r in range(2)}
    meta = data("metadata", step, 500)
    ops = [*_writes(shards), ("write", f"{folder}/.metadata.tmp", meta)]
    ops.append(("rename", f"{folder}/.metadata.tmp", f"{folder}/.metadata"))
    return Save("dcp", step, ops, folder, {**shards, f"{folder}/.metadata": meta})


def deepspeed(
    step: int, stage: int = 2, bf16: bool = False, ranks: int = 2, save_dir: str = "ds"
) -> Save:
    """``engine.save_checkpoint(save_dir)`` of a ``ranks``-process ZeRO ``stage`` run: model
    states (rank 0's ``mp_rank_00_model_states.pt``; each rank's
    ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` under ZeRO-3), then each rank's optimizer
    shard (``bf16_`` in front with bf16; none at stage 0 without bf16: the optimizer is in the
    model states), all written in place; rank 0 copies zero_to_fp32.py and zero_to_torch.py
    beside the tags after its shard, then writes ``latest``, before the closing barrier: the other
    ranks' files land after it."""
    tag = f"{save_dir}/global_step{step}"
    sharded = stage > 0 or bf16

    def rank_files(r: int) -> dict[str, bytes]:
        files = {}
        if stage == 3:
            name = f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
            files[f"{tag}/{name}"] = data(name, step)
        elif r == 0:
            files[f"{tag}/mp_rank_00_model_states.pt"] = data("model", step)
        if sharded:
            name = f"{'bf16_' if bf16 else ''}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            files[f"{tag}/{name}"] = data(name, step)
        return files

    first = rank_files(0)
    others = {p: b for r in range(1, ranks) for p, b in rank_files(r).items()}
    scripts = {
        f"{save_dir}/{n}": f"# {n}\n".encode() for n in ("zero_to_fp32.py", "zero_to_torch.py")
    }
    latest = f"{save_dir}/latest"
    ops = [
        *_writes(first),
        *(_writes(scripts) if sharded else []),
        ("write", latest, f"global_step{step}".encode()),
        *_writes(others),
    ]
    pointer = {latest: f"global_step{step}"}
    restored = {**first, **others, latest: pointer[latest].encode()}
    return Save("deepspeed", step, ops, save_dir, restored, pointer)


def megatron(step: int) -> Save:
    it = f"megatron/iter_{step:07d}"
    files = {f"{it}/mp_rank_{tp:02d}/model_optim_rng.pt": data(f"tp{tp}", step) for tp in (0, 1)}
    tracker = "megatron/latest_checkpointed_iteration.txt"
    ops = [*_writes(files), ("write", tracker, str(step).encode())]
    return Save(
        "megatron",
        step,
        ops,
        "megatron",
        {**files, tracker: str(step).encode()},
        {tracker: str(step)},
    )


def nemo(step: int) -> Save:
    name = f"nemo/checkpoints/model--val_loss=0.50-step={step}-consumed_samples={step * 8}.0"
    files = {
        f"{name}/weights/__0_0.distcp": data("weights", step),
        f"{name}/weights/.metadata": data("dcp-meta", step, 400),
        f"{name}/weights/metadata.json": b'{"sharded_backend": "torch_dist"}',
        f"{name}/context/io.json": b"{}",
        f"{name}/context/model.yaml": b"model: tiny\n",
    }
    ops: list[Op] = [("write", f"{name}-unfinished", b""), *_writes(files)]
    ops.append(("remove", f"{name}-unfinished", None))
    return Save("nemo", step, ops, name, files)


def mindformers(step: int, epoch: int = 1, ranks: int = 2) -> Save:
    """Each rank's CheckpointMonitor save, rank after rank (nothing syncs the ranks' saves):
    MindSpore writes ``<name>.tmp`` (the ``.ckpt`` suffix replaced) and renames it to the
    ``.ckpt`` (then makes it read-only, 0400); MindFormers then replaces ``meta.json`` from a
    ``tempfile`` in the rank's folder (``tmpXXXXXXXX``)."""
    root = "output/checkpoint"
    ops: list[Op] = []
    restored: dict[str, bytes] = {}
    extras: dict[str, str] = {}
    for r in range(ranks):
        stem = f"{root}/rank_{r}/llama_rank_{r}-{epoch}_{step}"
        blob = data(f"mf{r}", step)
        ops += [("write", f"{stem}.tmp", blob), ("rename", f"{stem}.tmp", f"{stem}.ckpt")]
        restored[f"{stem}.ckpt"] = blob
        meta = json.dumps(
            {
                "last_epoch": epoch,
                "last_step": step,
                "last_ckpt_file": f"llama_rank_{r}-{epoch}_{step}.ckpt",
            }
        )
        tmp = f"{root}/rank_{r}/tmpab12cd{r}"
        ops += [("write", tmp, meta.encode()), ("rename", tmp, f"{root}/rank_{r}/meta.json")]
        extras[f"{root}/rank_{r}/meta.json"] = meta
        restored[f"{root}/rank_{r}/meta.json"] = meta.encode()
    return Save("mindformers", epoch * 1_000_000 + step, ops, root, restored, extras)


def accelerate(i: int) -> Save:
    folder = f"project/checkpoints/checkpoint_{i}"
    names = ("model.safetensors", "optimizer.bin", "scheduler.bin", "sampler.bin")
    files = {f"{folder}/{n}": data(n, i) for n in names}
    files[f"{folder}/random_states_0.pkl"] = data("rng", i, 800)
    return Save("accelerate", i, _writes(files), folder, files)


SAVES: dict[str, Callable[[int], Save]] = {
    "hf": hf,
    "lightning": lightning,
    "composer": composer,
    "dcp": dcp,
    "deepspeed": deepspeed,
    "megatron": megatron,
    "nemo": nemo,
    "mindformers": mindformers,
    "accelerate": accelerate,
}
# More saves of a format, each in its own folder: the DeepSpeed files of other ZeRO stages and
# precisions (tests/e2e/test_real_layouts.py checks the names against the real library's).
VARIANTS: dict[str, Callable[[int], Save]] = {
    "deepspeed-zero3": partial(deepspeed, stage=3, save_dir="ds-zero3"),
    "deepspeed-bf16": partial(deepspeed, bf16=True, save_dir="ds-bf16"),
    "deepspeed-stage0": partial(deepspeed, stage=0, save_dir="ds-stage0"),
}
CASES = {**SAVES, **VARIANTS}
