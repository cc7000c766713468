"""A gang end to end: the example fine-tuning as two pods per attempt on the two pod runner nodes
(each pod with its own network namespace, hostname and DNS names), ``torchrun`` with one process
per node, DDP over gloo on CPU, every rank's sidecar committing its part of each checkpoint.

The run is preempted three times, one way each: rank 1 evicted (Eviction API); rank 0's node
NotReady; a notice taint on rank 1's node. Each time all pods of the attempt go, the next
attempt's two pods resume from the newest committed checkpoint, and the run ends with final
weights bitwise equal to an uninterrupted 2-node run of the same arguments (gloo on CPU is
bitwise deterministic here: tests/e2e/ddp_check.py shows two uninterrupted runs equal), with the
same loss at every step after the last resume. With the notice the gang saves at the next step
end: no step is lost. Steps lost per preemption are printed; with
``TRAININGRUN_WRITE_BENCHMARKS=docs/benchmarks.md`` they are also written there.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.benchutil import stamped, write_section
from tests.e2e import ddp_check
from tests.e2e.example import losses, pod_spec
from tests.e2e.test_full_chain import node_of, runner_for
from tests.integration.support import (
    Runs,
    evict,
    node_ready,
    read_committed,
    s3_reader,
    trainingrun,
    wait_for,
)
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle
from trainingrun.checkpoint.manifest import parse_run_manifest

pytestmark = pytest.mark.usefixtures("operator")

MAX_STEPS, SAVE_STEPS, STEP_DELAY = 40, 10, 0.3
SEED = int(os.environ.get("TRAININGRUN_E2E_SEED", "20261124"))
NOTICE = "karpenter.sh/disrupted"
COMMAND = "TRAININGRUN_WRITE_BENCHMARKS=docs/benchmarks.md .venv/bin/pytest tests/e2e/test_gang.py"


@pytest.fixture(scope="module")
def gang_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[int, float]]:
    """An uninterrupted 2-node run of the same arguments, as local processes."""
    work = tmp_path_factory.mktemp("gang-reference")
    gang = ddp_check.start(work, "reference", steps=(MAX_STEPS, SAVE_STEPS))
    assert gang.wait() == [0, 0], (work / "reference" / "node0.log").read_text()[-3000:]
    node0 = gang.nodes[0].folder
    weights = (node0 / f"checkpoint-{MAX_STEPS}" / "model.safetensors").read_bytes()
    return weights, losses(work / "reference" / "loss.jsonl")


def gang_run(name: str, env: LocalEnv, prefix: str, loss_dir: Path, nodes: list[str]) -> Any:
    body = trainingrun(name, env, prefix, restart_policy={"maxRestarts": 3})
    spec = pod_spec(loss_dir, nodes, MAX_STEPS, SAVE_STEPS, STEP_DELAY)
    spec["containers"][0]["command"] = [
        "torchrun",
        "--shutdown-timeout=50",  # below the grace period: the worker's save can finish
        "examples/finetune.py",
    ]
    body["spec"]["template"]["spec"] = spec
    body["spec"]["replicas"] = 2
    body["spec"]["preemption"] = {"terminationGracePeriodSeconds": 60}
    return body


class Gang:
    """One 2-pod TrainingRun of the example, and ways to watch its attempts."""

    def __init__(self, runs: Runs, env: LocalEnv, prefix: str, name: str, loss_dir: Path) -> None:
        self.runs, self.env, self.prefix, self.name = runs, env, prefix, name
        self.loss_dir = loss_dir

    @property
    def run_key(self) -> str:
        return f"{self.prefix}/{self.runs.namespace}/{self.name}"

    def pod(self, attempt: int, rank: int) -> str:
        return f"{self.name}-{attempt}-{rank}"

    def wait_attempt(self, attempt: int, timeout: float = 240) -> dict[str, Any]:
        return self.runs.wait_status(
            self.name,
            lambda s: s.get("activePod") == self.pod(attempt, 0) and s.get("attempt") == attempt,
            timeout,
            f"attempt {attempt} started",
        )

    def step(self, attempt: int) -> int:
        return max(losses(self.loss_dir / f"loss-{attempt}.jsonl"), default=0)

    def resume_step(self, attempt: int) -> int:
        trained = losses(self.loss_dir / f"loss-{attempt}.jsonl")
        return min(trained) - 1 if trained else 0

    def train_a_while(
        self, attempt: int, rng: random.Random, early: bool = False, timeout: float = 300
    ) -> int:
        """Waits until the attempt trained a few steps past its resume point; ``early``: to the
        second step after a regular save, so a save that follows is not a regular one."""
        wait_for(lambda: self.step(attempt), timeout, f"attempt {attempt} training")
        target = self.resume_step(attempt) + rng.randint(3, 6)
        if early:
            target += (2 - target) % SAVE_STEPS
        return wait_for(
            lambda: self.step(attempt) >= target and self.step(attempt),
            timeout,
            f"attempt {attempt} at step {target}",
        )

    def final_weights(self, s3: Any) -> bytes:
        """Rank 0's model in the committed checkpoint of the last step."""
        body = s3.get_object(Bucket=self.env.bucket, Key=f"{self.run_key}/manifest.json")
        manifest = parse_run_manifest(body["Body"].read())
        entry = next(e for e in manifest.entries if e.step == MAX_STEPS)
        assert entry.ranks == 2 and len(entry.part_prefixes) == 2
        part = f"{self.run_key}/{entry.part_prefixes[0]}"
        return read_committed(s3_reader(s3, self.env.bucket), part, "model.safetensors")


def set_taints(core: Any, node: str, taints: list[dict[str, Any]]) -> None:
    core.patch_node(node, {"spec": {"taints": taints}})


def test_three_preemptions_of_a_gang_resume_to_the_uninterrupted_weights(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    core_v1: Any,
    s3: Any,
    tmp_path: Path,
    gang_reference: tuple[bytes, dict[int, float]],
) -> None:
    weights, reference_losses = gang_reference
    rng = random.Random(SEED)
    nodes = [h.node for h in runner_nodes]
    runs.create(gang_run("gang", localenv, prefix, tmp_path, nodes))
    gang = Gang(runs, localenv, prefix, "gang", tmp_path)
    ns = runs.namespace

    # 1. Rank 1 evicted: its trainer gets SIGTERM, the ranks agree to save the next step.
    gang.wait_attempt(1)
    gang.train_a_while(1, rng)
    evict(core_v1, ns, gang.pod(1, 1))
    gang.wait_attempt(2)

    # 2. Rank 0's node reports NotReady (and is cordoned, as a failing node would be).
    gang.train_a_while(2, rng)
    node = node_of(runs, gang.pod(2, 0))
    core_v1.patch_node(node, {"spec": {"unschedulable": True}})
    runner_for(runner_nodes, node).report_not_ready()
    gang.wait_attempt(3)
    # The node comes back before it takes pods again: attempt 3 needs both nodes, and a pod
    # placed on it before the operator saw it Ready would end attempt 3 at once.
    runner_for(runner_nodes, node).make_ready()
    wait_for(lambda: node_ready(core_v1, node) == "True", 30, f"{node} Ready again")
    time.sleep(2)  # the operator's node watch catches up
    core_v1.patch_node(node, {"spec": {"unschedulable": False}})

    # 3. A notice taint on rank 1's node: every rank saves at the next step end and stops.
    gang.train_a_while(3, rng, early=True)
    node = node_of(runs, gang.pod(3, 1))
    before = list(core_v1.read_node(node).to_dict()["spec"].get("taints") or [])
    set_taints(core_v1, node, [*before, {"key": NOTICE, "effect": "NoSchedule"}])
    gang.wait_attempt(4)
    # The node replaced: cordoned while its notice goes, so that no pod of attempt 4 lands on
    # it before the operator saw the taint go (it would pass the notice on to the new pod).
    core_v1.patch_node(node, {"spec": {"unschedulable": True}})
    set_taints(core_v1, node, before)
    time.sleep(2)
    core_v1.patch_node(node, {"spec": {"unschedulable": False}})

    status = runs.wait_status(
        "gang", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run to end"
    )
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["preemptions"], status["restarts"]) == (4, 3, 0)

    lost = []
    for attempt, how in ((1, "rank 1 evicted"), (2, "rank 0's node NotReady"), (3, "notice")):
        trained, resumed = gang.step(attempt), gang.resume_step(attempt + 1)
        assert resumed <= trained
        lost.append((how, trained, resumed, trained - resumed))
    for how, trained, resumed, n in lost:
        print(f"{how}: trained to step {trained}, resumed from {resumed}: {n} steps lost")
    assert lost[2][3] == 0, "with a notice the gang saves at the next step end"
    assert lost[2][2] % SAVE_STEPS != 0, "the notice's save is not a regular one"
    assert lost[0][3] <= 1, "an eviction's SIGTERM save comes first"

    assert gang.final_weights(s3) == weights, "final weights differ from the uninterrupted run"
    last = losses(tmp_path / "loss-4.jsonl")
    assert sorted(last) == list(range(gang.resume_step(4) + 1, MAX_STEPS + 1))
    assert all(last[s] == reference_losses[s] for s in last)
    write_figures(lost)


def write_figures(lost: list[tuple[str, int, int, int]]) -> None:
    target = os.environ.get("TRAININGRUN_WRITE_BENCHMARKS")
    if not target:
        return
    rows = "\n".join(
        f"| {how} | {trained} | {resumed} | {n} |" for how, trained, resumed, n in lost
    )
    write_section(
        Path(target),
        "gang",
        stamped(
            "## Gang: steps lost per preemption\n\n"
            f"Command: `{COMMAND}`\n\n"
            "A 2-pod run of the example (torchrun, DDP over gloo on CPU, "
            f"{MAX_STEPS} steps, saves every {SAVE_STEPS}, {STEP_DELAY} s per step) on two pod "
            "runner nodes, preempted three times; final weights bitwise equal to an "
            "uninterrupted 2-node run.\n\n"
            "| preemption | last step trained | next attempt resumed from | steps lost |\n"
            "|---|---|---|---|\n"
            f"{rows}\n",
        ),
    )
