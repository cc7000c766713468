"""Saves MindFormers checkpoints with the real library (its ``CheckpointMonitor``, in the legacy
format, the default), on CPU, for the layout tests (tests/e2e/test_real_layouts.py). It runs in
the MindFormers stack's virtualenv (``make mindformers-env``):

    RANK_ID=0 python tests/layout_savers/mindformers_save.py OUT [--epochs E]
        [--steps-per-epoch S] [--every K] [--prefix P] [--keep N] [--format ckpt|safetensors]
        [--journal FILE]

A dense layer trained for E epochs of S steps, saved every K steps into
``OUT/checkpoint/rank_<r>/<P>_rank_<r>-<epoch>_<step in epoch>.ckpt`` with ``meta.json`` beside,
keeping the newest N; ``r`` is ``RANK_ID`` (0 when unset: one process, no distributed init). Two
processes with ``RANK_ID`` 0 and 1 and the same OUT write the folders of a two-rank run.
MindFormers logs into ``./output/log`` of the working directory.

``--journal FILE`` records every file operation the library makes under OUT, in order (a Python
audit hook, nothing patched), one JSON line each: ``mkdir``, ``create`` (a file opened for
writing), ``rename`` (``os.rename`` and ``os.replace``, with the bytes of the file renamed,
base64), ``remove`` and ``chmod``. Paths are relative to OUT. A test replays them to stop the
save at any point.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import mindformers
import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindformers.core.callback import CheckpointMonitor
from mindspore import nn

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


class Journal:
    """The file operations under ``root``, from the audit events of the interpreter."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve()) + os.sep
        self.entries: list[dict[str, Any]] = []
        self.reading = False  # the hook's own read of a renamed file is not an operation

    def relative(self, path: object) -> str | None:
        if not isinstance(path, str | bytes | os.PathLike):
            return None
        full = os.path.abspath(os.fsdecode(path))
        return full[len(self.root) :] if full.startswith(self.root) else None

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.reading or not args:
            return
        path = self.relative(args[0])
        if path is None:
            return
        if event == "open" and self._writes(args[1], args[2]) and not os.path.isdir(args[0]):
            self.entries.append({"op": "create", "path": path})
        elif event == "os.rename":
            self.reading = True
            try:
                data = Path(os.fsdecode(args[0])).read_bytes()
            finally:
                self.reading = False
            dst = self.relative(args[1])
            blob = base64.b64encode(data).decode()
            self.entries.append({"op": "rename", "path": path, "to": dst, "data": blob})
        elif event == "os.mkdir":
            self.entries.append({"op": "mkdir", "path": path})
        elif event == "os.remove":
            self.entries.append({"op": "remove", "path": path})
        elif event == "os.chmod":
            self.entries.append({"op": "chmod", "path": path, "mode": args[1]})

    @staticmethod
    def _writes(mode: object, flags: object) -> bool:
        if isinstance(mode, str):
            return any(c in mode for c in "wax+")
        return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="CheckpointMonitor's directory")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=4)
    p.add_argument("--every", type=int, default=2, help="save_checkpoint_steps")
    p.add_argument("--prefix", default="llama")
    p.add_argument("--keep", type=int, default=5, help="keep_checkpoint_max")
    p.add_argument("--format", default="ckpt", choices=("ckpt", "safetensors"))
    p.add_argument("--journal", type=Path, help="JSON lines: the file operations under OUT")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    journal = Journal(args.out)
    if args.journal is not None:
        sys.addaudithook(journal.hook)

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    rows = args.steps_per_epoch * 2  # batches of 2
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    y = rng.standard_normal((rows, 2)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)

    net = nn.Dense(4, 2)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = ms.train.Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    monitor = CheckpointMonitor(
        prefix=args.prefix,
        directory=str(args.out),
        save_checkpoint_steps=args.every,
        keep_checkpoint_max=args.keep,
        checkpoint_format=args.format,
    )
    model.train(args.epochs, data, callbacks=[monitor], dataset_sink_mode=False)

    if args.journal is not None:
        journal.reading = True  # our own write is not the library's
        args.journal.write_text("".join(json.dumps(e) + "\n" for e in journal.entries))
    print(f"mindformers {mindformers.__version__} (mindspore {ms.__version__}) saved to {args.out}")


if __name__ == "__main__":
    main()
