"""The example fine-tuning (examples/finetune.py) as the e2e tests use it: its loss log, its
uninterrupted run as a plain local process (the reference a disrupted run must match), and the
pod spec of a TrainingRun of it on the test's own pod runner nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

from tests.podrunner.node import TOLERATION
from trainingrun.contract import TRAINER_CONTAINER

REPO = Path(__file__).resolve().parents[2]


class Steps(NamedTuple):
    max_steps: int
    save_steps: int
    step_delay: float


# The example as test_full_chain, test_suspend and test_kueue run it (conftest chain_reference).
CHAIN_STEPS = Steps(60, 10, 0.25)


def losses(path: Path) -> dict[int, float]:
    """Step -> loss from a loss log (one JSON line per step); empty when there is none yet."""
    if not path.exists():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def uninterrupted(work: Path, max_steps: int, save_steps: int) -> tuple[bytes, dict[int, float]]:
    """(final weights, losses) of the example run start to end in ``work`` (no step delay: the
    delay is a sleep and changes nothing else)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "finetune.py"),
            f"--max-steps={max_steps}",
            f"--save-steps={save_steps}",
            f"--loss-log={work / 'loss.jsonl'}",
        ],
        env={**os.environ, "TRAININGRUN_CHECKPOINT_DIR": str(work / "ck")},
        cwd=work,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    weights = (work / "ck" / f"checkpoint-{max_steps}" / "model.safetensors").read_bytes()
    return weights, losses(work / "loss.jsonl")


def on_nodes(nodes: list[str]) -> dict[str, Any]:
    """The placement part of a pod spec: only on ``nodes``, the test's own pod runner nodes
    (other tests may run pod runners of their own), whose taint it tolerates."""
    hostnames = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [hostnames]}]
                }
            }
        },
        "tolerations": [dict(TOLERATION)],
    }


def pod_spec(
    loss_dir: Path, nodes: list[str], max_steps: int, save_steps: int, step_delay: float
) -> dict[str, Any]:
    """The pod template's spec of a TrainingRun of the example on the test's own runner nodes
    (``on_nodes``); each attempt logs its losses to ``<loss_dir>/loss-<attempt>.jsonl``."""
    return {
        **on_nodes(nodes),
        "containers": [
            {
                "name": TRAINER_CONTAINER,
                "image": "example.invalid/finetune:1",  # the pod runner runs the command locally
                "workingDir": str(REPO),
                "command": ["python", "examples/finetune.py"],
                "args": [
                    f"--max-steps={max_steps}",
                    f"--save-steps={save_steps}",
                    f"--step-delay={step_delay}",
                    f"--loss-log={loss_dir}/loss-$(TRAININGRUN_ATTEMPT).jsonl",
                ],
            }
        ],
    }
