"""The Lightning and Composer examples (examples/lightning_finetune.py and
examples/composer_finetune.py) as the e2e tests run them: each with the python of its stack's
virtualenv (hack/trainer-env.sh, ``make lightning-env`` / ``make composer-env``), its
uninterrupted run as a plain local process (the reference a disrupted run must match), a
TrainingRun of it on the test's pod runner nodes, and ways to watch and disturb its attempts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.example import REPO, losses, pod_spec
from tests.e2e.test_full_chain import node_of, runner_for
from tests.integration.support import Runs, trainingrun, wait_for
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    RUN_MANIFEST,
    RunManifest,
    parse_run_manifest,
)
from trainingrun.contract import (
    CHECKPOINT_VOLUME,
    ENV_CHECKPOINT_DIR,
    ENV_EPOCH,
    ENV_RESUME_FROM,
    SYNC_CONTAINER,
    TRAINER_CONTAINER,
)

FRAMEWORKS = ("lightning", "composer")
# Every run of the examples in these tests, and the uninterrupted reference they must match.
MAX_STEPS, SAVE_STEPS = 40, 10
BUILD_TIMEOUT_S = 3600  # a cold build downloads GBs of wheels


def stack_python(framework: str) -> Path:
    """The python of the framework's virtualenv; hack/trainer-env.sh returns at once when it is
    built and builds it otherwise (``make <framework>-env`` does the same ahead of the tests)."""
    try:
        proc = subprocess.run(
            ["bash", str(REPO / "hack" / "trainer-env.sh"), framework],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building the {framework} virtualenv took over {BUILD_TIMEOUT_S}s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"the {framework} virtualenv is not there and could not be built "
            f"(hack/trainer-env.sh exit {proc.returncode}): run `make {framework}-env`\n"
            f"{proc.stderr[-2000:]}"
        )
    python = Path(lines[-1]) / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} is missing: run `make {framework}-env`")
    return python


def script(framework: str) -> str:
    return f"examples/{framework}_finetune.py"


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run: final weights, step -> loss, and seconds to its first step
    (starting python and importing the framework)."""

    weights: bytes
    losses: dict[int, float]
    first_step_s: float
    total_s: float


@dataclass(frozen=True)
class Stack:
    """A framework, the python of its virtualenv, and its uninterrupted run with the checkpoint
    folder that run saved into."""

    framework: str
    python: Path
    reference: Reference
    ckdir: Path


# The session fixture ``reference_stacks`` (tests/e2e/conftest.py): framework -> its Stack.
References = Callable[[str], Stack]


def launch(
    framework: str,
    python: Path,
    ckdir: Path,
    loss_log: Path,
    delay: float = 0.0,
    resume: str = "",
    stdout: Any = subprocess.DEVNULL,
    stderr: Any = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """The example as a plain local process of MAX_STEPS steps, a save every SAVE_STEPS, saving
    into ``ckdir`` and resuming from ``resume`` (none when empty); no TRAININGRUN_ variable of
    the test's own environment reaches it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAININGRUN_")}
    env.update(
        {
            "PYTHONPATH": str(REPO / "operator"),
            ENV_CHECKPOINT_DIR: str(ckdir),
            ENV_RESUME_FROM: resume,
        }
    )
    return subprocess.Popen(
        [
            str(python),
            script(framework),
            f"--max-steps={MAX_STEPS}",
            f"--save-steps={SAVE_STEPS}",
            f"--loss-log={loss_log}",
            f"--step-delay={delay}",
        ],
        env=env,
        cwd=REPO,
        stdout=stdout,
        stderr=stderr,
        text=True,
    )


def uninterrupted(framework: str, python: Path, work: Path) -> Reference:
    """The example run start to end in ``work``, saving into ``work/ck`` (no step delay: the
    delay is a sleep and changes nothing else)."""
    log = work / "loss.jsonl"
    started = time.monotonic()
    with (work / "out.log").open("wb") as out:
        proc = launch(framework, python, work / "ck", log, stdout=out, stderr=subprocess.STDOUT)
        try:
            first = wait_for(
                lambda: (log.exists() or proc.poll() is not None) and time.monotonic(),
                600,
                f"the {framework} reference's first step",
            )
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 0, (work / "out.log").read_text(errors="replace")[-3000:]
    return Reference(
        weights=(work / "ck" / "final" / "weights.bin").read_bytes(),
        losses=losses(log),
        first_step_s=first - started,
        total_s=time.monotonic() - started,
    )


def reference_stack(framework: str, work: Path) -> Stack:
    """The framework's python (built if need be) and its uninterrupted run in ``work``."""
    python = stack_python(framework)
    reference = uninterrupted(framework, python, work)
    print(
        f"\n{framework} reference: {MAX_STEPS} steps, first step {reference.first_step_s:.1f}s "
        f"after start (python and the framework's import), done in {reference.total_s:.1f}s"
    )
    return Stack(framework, python, reference, work / "ck")


def framework_run(
    name: str,
    env: LocalEnv,
    prefix: str,
    framework: str,
    python: Path,
    loss_dir: Path,
    nodes: list[str],
    steps: tuple[int, int, float],
) -> dict[str, Any]:
    """A TrainingRun of the example on ``nodes``; each attempt logs its losses to
    ``<loss_dir>/loss-<attempt>.jsonl``. The format is left to ``auto``. ``keep`` holds every
    checkpoint, so the manifest at the end still tells what each attempt could resume from."""
    max_steps, save_steps, step_delay = steps
    body = trainingrun(name, env, prefix, restart_policy={"maxRestarts": 5})
    body["spec"]["preemption"] = {"terminationGracePeriodSeconds": 60}
    body["spec"]["checkpoint"]["keep"] = 20
    spec = pod_spec(loss_dir, nodes, max_steps, save_steps, step_delay)
    trainer = spec["containers"][0]
    trainer["image"] = f"example.invalid/{framework}-finetune:1"
    trainer["command"] = [str(python), script(framework)]
    trainer["env"] = [{"name": "PYTHONPATH", "value": str(REPO / "operator")}]
    body["spec"]["template"]["spec"] = spec
    return body


class FrameworkRun:
    """One TrainingRun of a framework example: its attempts' loss logs, its bucket manifest,
    and its trainer processes on the runner nodes."""

    def __init__(
        self,
        runs: Runs,
        env: LocalEnv,
        prefix: str,
        name: str,
        loss_dir: Path,
        nodes: list[RunnerHandle],
        body: dict[str, Any],
    ) -> None:
        self.runs, self.env, self.prefix, self.name = runs, env, prefix, name
        self.loss_dir, self.nodes, self.body = loss_dir, nodes, body
        self.started: dict[int, float] = {}  # attempt -> when its start was seen (monotonic)
        self.epochs: dict[int, int] = {}  # attempt -> the epoch its fence gave it
        self.resumes: dict[int, str] = {}  # attempt -> its trainer's TRAININGRUN_RESUME_FROM

    def create(self) -> None:
        self.runs.create(self.body)

    def delete(self) -> None:
        self.runs.delete(self.name)

    def gone(self) -> bool:
        try:
            self.runs.get(self.name)
        except client.ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    @property
    def run_key(self) -> str:
        return f"{self.prefix}/{self.runs.namespace}/{self.name}"

    def pod(self, attempt: int) -> str:
        return f"{self.name}-{attempt}"

    # -- attempts and their loss logs ------------------------------------------------------------

    def wait_attempt(self, attempt: int, timeout: float = 300) -> dict[str, Any]:
        """The status once the attempt started; notes its epoch and resume path (its pod is
        deleted once the next attempt starts)."""
        status = self.runs.wait_status(
            self.name,
            lambda s: s.get("activePod") == self.pod(attempt) and s.get("attempt") == attempt,
            timeout,
            f"attempt {attempt} of {self.name} started",
        )
        self.started[attempt] = time.monotonic()
        self.note(attempt)
        return status

    def note(self, attempt: int) -> None:
        """Notes the attempt's epoch and its trainer's TRAININGRUN_RESUME_FROM from its pod."""
        pod = self.runs.pod(self.pod(attempt))
        assert pod is not None, f"no pod {self.pod(attempt)}"
        self.epochs[attempt] = int(self.runs.env_of(pod, SYNC_CONTAINER)[ENV_EPOCH])
        self.resumes[attempt] = self.runs.env_of(pod).get(ENV_RESUME_FROM, "")

    def log(self, attempt: int) -> Path:
        return self.loss_dir / f"loss-{attempt}.jsonl"

    def step(self, attempt: int) -> int:
        return max(losses(self.log(attempt)), default=0)

    def wait_step(self, attempt: int, step: int, timeout: float = 300) -> int:
        return wait_for(
            lambda: self.step(attempt) >= step and self.step(attempt),
            timeout,
            f"attempt {attempt} of {self.name} at step {step}",
        )

    def resume_step(self, attempt: int) -> int:
        """The step an attempt resumed from: the one before the first step it trained."""
        trained = losses(self.log(attempt))
        return min(trained) - 1 if trained else 0

    def wait_resume_step(self, attempt: int) -> int:
        """Once the attempt trained its first step; prints how long that took after its start
        was seen (pod start, restore, python and the framework's import)."""
        wait_for(lambda: self.step(attempt), 300, f"attempt {attempt} of {self.name} training")
        since = time.monotonic() - self.started.get(attempt, time.monotonic())
        print(f"{self.name} attempt {attempt}: first step {since:.1f}s after it started")
        return self.resume_step(attempt)

    # -- the trainer process ---------------------------------------------------------------------

    def node(self, attempt: int) -> RunnerHandle:
        return runner_for(self.nodes, node_of(self.runs, self.pod(attempt)))

    def signal_trainer(self, attempt: int, sig: signal.Signals) -> None:
        handle = self.node(attempt)
        os.kill(handle.wait_pid(self.runs.namespace, self.pod(attempt), TRAINER_CONTAINER), sig)

    def volume(self, attempt: int) -> Path:
        """The pod's checkpoint folder on its node (the runner keeps it until the pod is
        deleted)."""
        pod_dir = self.node(attempt).pod_dir(self.runs.namespace, self.pod(attempt))
        return pod_dir / "volumes" / CHECKPOINT_VOLUME

    def final_weights(self, attempt: int) -> bytes:
        return (self.volume(attempt) / "final" / "weights.bin").read_bytes()

    # -- the bucket ------------------------------------------------------------------------------

    def manifest(self, s3: Any) -> RunManifest | None:
        try:
            body = s3.get_object(Bucket=self.env.bucket, Key=f"{self.run_key}/{RUN_MANIFEST}")
        except s3.exceptions.NoSuchKey:
            return None
        return parse_run_manifest(body["Body"].read())

    def committed(self, s3: Any) -> list[int]:
        manifest = self.manifest(s3)
        return sorted(e.step for e in manifest.entries) if manifest else []

    def object_keys(self, s3: Any, step: int) -> list[str]:
        """The keys of the committed checkpoint's files (its part records left out)."""
        manifest = self.manifest(s3)
        assert manifest is not None
        entry = next(e for e in manifest.entries if e.step == step)
        keys = []
        for part in entry.part_prefixes:
            listed = s3.list_objects_v2(Bucket=self.env.bucket, Prefix=f"{self.run_key}/{part}")
            keys += [
                o["Key"]
                for o in listed.get("Contents", [])
                if not o["Key"].endswith(CHECKPOINT_MANIFEST)
            ]
        return keys

    def damage(self, s3: Any, step: int) -> list[str]:
        """Flips one bit in every file of the committed checkpoint ``step``, sizes unchanged."""
        keys = self.object_keys(s3, step)
        for key in keys:
            body = bytearray(s3.get_object(Bucket=self.env.bucket, Key=key)["Body"].read())
            body[len(body) // 3] ^= 0x01
            s3.put_object(Bucket=self.env.bucket, Key=key, Body=bytes(body))
        return keys


def newest_before(manifest: RunManifest, epoch: int) -> int:
    """The newest step committed under an epoch older than ``epoch``: what was committed when
    the attempt of ``epoch`` took the fence (no older epoch commits after that), 0 for none."""
    return max((e.step for e in manifest.entries if e.epoch < epoch), default=0)
