"""The whole chain, end to end: the operator, the real control plane, SeaweedFS, and attempts'
pods run as real processes by two local pod runner nodes (restore init container, sync sidecar,
and the example HuggingFace fine-tuning script as the trainer).

Covers:
- a run disrupted three times at random steps (Eviction API, its node reporting NotReady, the
  trainer process SIGKILLed) resumes each time from the bucket manifest, finishes, and its final
  weights are bitwise equal to an uninterrupted run's, with the same loss at every step trained
  after the last resume; steps lost per disruption are printed;
- the newest committed checkpoint corrupted in the bucket before a resume, with the restore
  beside the trainer (``restoreMode: AlongsideTrainer``): the restore refuses it while the
  trainer waits, the run falls back to the previous checkpoint and still ends with the same
  weights.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.example import CHAIN_STEPS, losses, pod_spec
from tests.integration.support import (
    Runs,
    committed_file,
    evict,
    read_committed,
    s3_reader,
    trainingrun,
    wait_for,
)
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle
from trainingrun.checkpoint.manifest import parse_run_manifest

pytestmark = pytest.mark.usefixtures("operator")

MAX_STEPS, SAVE_STEPS, STEP_DELAY = CHAIN_STEPS
SEED = int(os.environ.get("TRAININGRUN_E2E_SEED", "20261122"))


def finetune_run(
    name: str, env: LocalEnv, prefix: str, loss_dir: Path, nodes: list[str]
) -> dict[str, Any]:
    body = trainingrun(name, env, prefix, restart_policy={"maxRestarts": 5})
    body["spec"]["preemption"] = {"terminationGracePeriodSeconds": 60}
    body["spec"]["template"]["spec"] = pod_spec(loss_dir, nodes, MAX_STEPS, SAVE_STEPS, STEP_DELAY)
    return body


class Chain:
    """One TrainingRun of the example, and ways to watch and disturb its attempts."""

    def __init__(
        self,
        runs: Runs,
        env: LocalEnv,
        prefix: str,
        name: str,
        loss_dir: Path,
        nodes: list[RunnerHandle],
        shape: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: body,
    ) -> None:
        """Creates the run, its body changed by ``shape`` (labels, resources) first."""
        self.runs, self.env, self.prefix, self.name = runs, env, prefix, name
        self.loss_dir = loss_dir
        runs.create(shape(finetune_run(name, env, prefix, loss_dir, [h.node for h in nodes])))

    @property
    def run_key(self) -> str:
        return f"{self.prefix}/{self.runs.namespace}/{self.name}"

    def pod(self, attempt: int) -> str:
        return f"{self.name}-{attempt}"

    def wait_attempt(self, attempt: int, timeout: float = 180) -> dict[str, Any]:
        return self.runs.wait_status(
            self.name,
            lambda s: s.get("activePod") == self.pod(attempt) and s.get("attempt") == attempt,
            timeout,
            f"attempt {attempt} started",
        )

    def step(self, attempt: int) -> int:
        return max(losses(self.loss_dir / f"loss-{attempt}.jsonl"), default=0)

    def wait_step(self, attempt: int, step: int, timeout: float = 240) -> int:
        return wait_for(
            lambda: self.step(attempt) >= step and self.step(attempt),
            timeout,
            f"attempt {attempt} at step {step}",
        )

    def resume_step(self, attempt: int) -> int:
        """The step an attempt resumed from: the one before the first step it trained."""
        trained = losses(self.loss_dir / f"loss-{attempt}.jsonl")
        return min(trained) - 1 if trained else 0

    def wait_resume_step(self, attempt: int) -> int:
        wait_for(lambda: self.step(attempt), 240, f"attempt {attempt} training")
        return self.resume_step(attempt)

    def part(self, s3: Any, step: int) -> str:
        """The key prefix of rank 0's part of the committed checkpoint ``step``: the entry says
        which attempt's objects are the committed ones."""
        body = s3.get_object(Bucket=self.env.bucket, Key=f"{self.run_key}/manifest.json")
        manifest = parse_run_manifest(body["Body"].read())
        entry = next(e for e in manifest.entries if e.step == step)
        return f"{self.run_key}/{entry.part_prefixes[0]}"

    def weights(self, s3: Any, step: int) -> bytes:
        """Rank 0's model.safetensors in the committed checkpoint ``step``."""
        get = s3_reader(s3, self.env.bucket)
        return read_committed(get, self.part(s3, step), "model.safetensors")

    def assert_matches_reference(
        self, s3: Any, reference: tuple[bytes, dict[int, float]], attempt: int, resumed: int
    ) -> None:
        """The run's final weights are the uninterrupted run's, bitwise, and the losses of
        ``attempt`` (resumed from step ``resumed``) are its losses, every step to the end."""
        weights, reference_losses = reference
        final = self.weights(s3, MAX_STEPS)
        assert final == weights, "final weights differ from the uninterrupted run"
        last = losses(self.loss_dir / f"loss-{attempt}.jsonl")
        assert sorted(last) == list(range(resumed + 1, MAX_STEPS + 1))
        assert all(last[s] == reference_losses[s] for s in last)

    def committed(self, s3: Any) -> list[int]:
        try:
            body = s3.get_object(Bucket=self.env.bucket, Key=f"{self.run_key}/manifest.json")
        except s3.exceptions.NoSuchKey:
            return []
        return sorted(e["step"] for e in json.loads(body["Body"].read())["entries"])


def node_of(runs: Runs, pod: str) -> str:
    return str(runs.pod(pod).spec.node_name)


def runner_for(nodes: list[RunnerHandle], node: str) -> RunnerHandle:
    return next(h for h in nodes if h.node == node)


def test_three_disruptions_resume_to_the_uninterrupted_weights(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    core_v1: Any,
    s3: Any,
    tmp_path: Path,
    chain_reference: tuple[bytes, dict[int, float]],
) -> None:
    rng = random.Random(SEED)
    chain = Chain(runs, localenv, prefix, "chain", tmp_path, runner_nodes)
    ns = runs.namespace
    lost: list[tuple[str, int, int, int]] = []  # (how, last step trained, resumed from, lost)

    # 1. Eviction API: SIGTERM, the callback saves at the next step end, the sidecar drains.
    chain.wait_attempt(1)
    chain.wait_step(1, rng.randint(12, 22))
    evict(core_v1, ns, chain.pod(1))
    chain.wait_attempt(2)

    # 2. Its node reports NotReady (and is cordoned, as a failing node would be drained).
    start = chain.wait_resume_step(2)
    chain.wait_step(2, start + rng.randint(4, 12))
    node = node_of(runs, chain.pod(2))
    core_v1.patch_node(node, {"spec": {"unschedulable": True}})
    runner_for(runner_nodes, node).report_not_ready()
    chain.wait_attempt(3)
    runner_for(runner_nodes, node).make_ready()
    core_v1.patch_node(node, {"spec": {"unschedulable": False}})

    # 3. The trainer process is SIGKILLed.
    start = chain.wait_resume_step(3)
    chain.wait_step(3, start + rng.randint(4, 12))
    handle = runner_for(runner_nodes, node_of(runs, chain.pod(3)))
    os.kill(handle.wait_pid(ns, chain.pod(3), "trainer"), signal.SIGKILL)
    chain.wait_attempt(4)

    status = runs.wait_status(
        "chain", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run to end"
    )
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 4
    assert status["preemptions"] == 2 and status["restarts"] == 1

    for attempt, how in ((1, "Eviction API"), (2, "node NotReady"), (3, "trainer SIGKILL")):
        trained, resumed = chain.step(attempt), chain.resume_step(attempt + 1)
        assert resumed <= trained
        lost.append((how, trained, resumed, trained - resumed))
    for how, trained, resumed, n in lost:
        print(f"{how}: trained to step {trained}, resumed from {resumed}: {n} steps lost")
    assert lost[0][3] <= 1, "a graceful eviction should lose no step: the save comes first"

    chain.assert_matches_reference(s3, chain_reference, 4, chain.resume_step(4))


def test_corrupt_newest_checkpoint_falls_back_and_still_matches(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    s3: Any,
    tmp_path: Path,
    chain_reference: tuple[bytes, dict[int, float]],
) -> None:
    weights, _ = chain_reference

    def alongside(body: dict[str, Any]) -> dict[str, Any]:
        body["spec"]["checkpoint"]["restoreMode"] = "AlongsideTrainer"
        return body

    chain = Chain(runs, localenv, prefix, "corrupt", tmp_path, runner_nodes, alongside)
    ns = runs.namespace
    chain.wait_attempt(1)
    # Kill the trainer once checkpoint-20 is committed and before checkpoint-30 is saved.
    wait_for(lambda: 20 in chain.committed(s3), 240, "checkpoint-20 committed")
    assert chain.step(1) < 29, "the trainer ran ahead of the sidecar; raise STEP_DELAY"
    get = s3_reader(s3, localenv.bucket)
    where = committed_file(get, chain.part(s3, 20), "model.safetensors")  # its object, or pack
    body = bytearray(get(where.key))
    body[where.offset + where.size // 3] ^= 0x01
    s3.put_object(Bucket=localenv.bucket, Key=where.key, Body=bytes(body))
    handle = runner_for(runner_nodes, node_of(runs, chain.pod(1)))
    os.kill(handle.wait_pid(ns, chain.pod(1), "trainer"), signal.SIGKILL)

    status = runs.wait_status(
        "corrupt", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run to end"
    )
    assert status["phase"] == "Succeeded", status
    assert status["badCheckpoints"] == [20]
    # Attempt 2 chose checkpoint-20 and its restore, beside the trainer, refused it: the trainer
    # trained no step; attempt 3 resumed from checkpoint-10.
    assert not (tmp_path / "loss-2.jsonl").exists()
    assert chain.resume_step(3) == 10
    assert runs.wait_events("corrupt", "CheckpointBad")
    # The trainer of attempt 3 took its checkpoint from the restore beside it.
    log = "".join(h.log_of(ns, chain.pod(3), "trainer") for h in runner_nodes)
    assert "the restore is done after" in log, log[-3000:]
    assert chain.weights(s3, MAX_STEPS) == weights
