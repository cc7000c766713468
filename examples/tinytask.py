"""The small task the Lightning and Composer examples train: a synthetic classification data set
made from a fixed seed, an MLP built from a config, the options every example takes, the loss
log line and the final weights as bytes that depend on nothing but their values. Only torch is
needed; each example imports it from its own folder (``python examples/<name>.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

CONFIG = {"features": 32, "hidden": 64, "layers": 2, "classes": 8, "samples": 256}


def make_dataset(seed: int) -> TensorDataset:
    """Inputs drawn from a normal distribution, labels from a random teacher network (plus a
    little label noise), all fixed by the seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(CONFIG["samples"], CONFIG["features"], generator=g)
    teacher = torch.randn(CONFIG["features"], CONFIG["classes"], generator=g)
    logits = x @ teacher + 0.5 * torch.randn(CONFIG["samples"], CONFIG["classes"], generator=g)
    return TensorDataset(x, logits.argmax(dim=1))


def make_model() -> nn.Sequential:
    """The MLP of CONFIG: features -> hidden (x layers, GELU) -> classes."""
    layers: list[nn.Module] = []
    width = CONFIG["features"]
    for _ in range(CONFIG["layers"]):
        layers += [nn.Linear(width, CONFIG["hidden"]), nn.GELU()]
        width = CONFIG["hidden"]
    layers.append(nn.Linear(width, CONFIG["classes"]))
    return nn.Sequential(*layers)


def log_step(path: Path | None, step: int, loss: float) -> None:
    """Appends ``{"step": .., "loss": ..}`` to the loss log (``-``: stdout; None: no log)."""
    if path is None:
        return
    line = json.dumps({"step": step, "loss": loss}) + "\n"
    if str(path) == "-":
        sys.stdout.write(line)
        sys.stdout.flush()
    else:
        with path.open("a") as f:
            f.write(line)


def save_final(model: nn.Module, folder: Path) -> Path:
    """The weights as bytes that depend on nothing but their values: every tensor of the state
    dict, raw, in sorted key order, into folder/weights.bin (written whole, then renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    target = folder / "weights.bin"
    partial = folder / "weights.bin.partial"
    with partial.open("wb") as f:
        for key in sorted(state):
            f.write(state[key].detach().cpu().contiguous().numpy().tobytes())
    partial.replace(target)
    return target


def env_default(name: str, default: str) -> str:
    return os.environ.get(f"FINETUNE_{name}", default)


def parse_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The examples' options; each also reads a ``FINETUNE_*`` variable."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--max-steps", type=int, default=int(env_default("MAX_STEPS", "60")))
    parser.add_argument("--save-steps", type=int, default=int(env_default("SAVE_STEPS", "10")))
    parser.add_argument("--batch-size", type=int, default=int(env_default("BATCH_SIZE", "8")))
    parser.add_argument("--seed", type=int, default=int(env_default("SEED", "42")))
    parser.add_argument("--lr", type=float, default=float(env_default("LR", "3e-3")))
    parser.add_argument(
        "--step-delay",
        type=float,
        default=float(env_default("STEP_DELAY", "0")),
        help="seconds to sleep after each step (makes room for a preemption in tests)",
    )
    parser.add_argument(
        "--loss-log",
        type=Path,
        default=env_default("LOSS_LOG", "") or None,
        help="append one JSON line per step here (- for stdout)",
    )
    return parser.parse_args(argv)
