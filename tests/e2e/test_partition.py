"""A network partition, end to end: the node of attempt 1 loses the API server while its
processes keep running. The operator, the real control plane, SeaweedFS, and two local pod
runner nodes whose pods run as real processes (restore, sync sidecar, the example HuggingFace
fine-tuning script).

Covers: the pod runner of attempt 1 is partitioned from the API server (no heartbeat, no status
write, deletions unseen) and its node marked ``Unknown``, as the node-lifecycle controller marks
it; the operator force-deletes the attempt and starts attempt 2 on the other node, while attempt 1
keeps training, saving the same steps and running its sync sidecar against the bucket for at
least a minute after attempt 2 started. Afterwards: no object named by a committed entry changed
its bytes (the checksums its part's MANIFEST.json recorded when the entry first appeared,
compared with checksums computed from the bucket's bytes, and the MANIFEST.json bytes
themselves); no entry of attempt 1 appeared once the fence had moved on; attempt 2 never ended
CheckpointBad; attempt 1's processes are stopped once the partition heals; the run ends with the
weights of an uninterrupted run, bitwise, and attempt 2 trains the uninterrupted run's losses.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.example import losses, pod_spec, uninterrupted
from tests.integration.support import (
    Runs,
    mark_unknown,
    pid_alive,
    read_committed,
    s3_reader,
    trainingrun,
    wait_for,
)
from tests.localenv import LocalEnv, s3_client
from tests.podrunner import RunnerHandle
from trainingrun.checkpoint.local import COMPLETE_MARKER
from trainingrun.checkpoint.manifest import ManifestEntry, RunManifest, parse_run_manifest
from trainingrun.contract import CHECKPOINT_VOLUME, SYNC_CONTAINER, TRAINER_CONTAINER
from trainingrun.decide import reasons as R
from trainingrun.storage import checksum

pytestmark = pytest.mark.usefixtures("operator")

# Attempt 1 must still train a minute after attempt 2 started, from about step 35 on (startup
# and the resubmission take ~10 s at 2 steps a second): 200 steps leave it ~40 s to spare.
MAX_STEPS, SAVE_STEPS, STEP_DELAY = 200, 10, 0.5
OVERLAP_S = 60  # attempt 1 trains on at least this long after attempt 2's first step
GRACE_S = 20  # the pods' termination grace: attempt 1 is stopped within it after the heal
POLL_S = 0.3
WATCH_LIMIT_S = 600


@pytest.fixture(scope="module")
def partition_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[int, float]]:
    """The uninterrupted run of the same spec, as a plain local process."""
    return uninterrupted(tmp_path_factory.mktemp("reference"), MAX_STEPS, SAVE_STEPS)


def partition_run(
    name: str, env: LocalEnv, prefix: str, loss_dir: Path, nodes: list[str]
) -> dict[str, Any]:
    """The example fine-tuning on this test's two runner nodes; every committed checkpoint is
    kept, so every one can be checked at the end; a failure ends the run (no restarts)."""
    body = trainingrun(name, env, prefix, restart_policy={"maxRestarts": 0})
    body["spec"]["checkpoint"]["keep"] = 1000
    body["spec"]["preemption"] = {"terminationGracePeriodSeconds": GRACE_S}
    body["spec"]["template"]["spec"] = pod_spec(loss_dir, nodes, MAX_STEPS, SAVE_STEPS, STEP_DELAY)
    return body


# ---------------------------------------------------------------------------------------------
# the bucket, watched while it changes


@dataclass
class Seen:
    """A committed entry as the poll that first showed it saw it, with what its parts'
    MANIFEST.json files said then: file key -> (the object holding it, its own or its pack,
    offset, size, algorithm, checksum), and the sha256 of each MANIFEST.json."""

    entry: ManifestEntry
    poll: int
    # file -> (its object: its own or its pack, offset, size, checksum algorithm, checksum)
    objects: dict[str, tuple[str, int, int, str, str]] = field(default_factory=dict)
    manifests: dict[str, str] = field(default_factory=dict)


class ManifestWatch:
    """Polls the run's ``manifest.json`` in a thread of its own (bounded in time): the fence at
    every poll, and each committed entry as first seen."""

    def __init__(self, env: LocalEnv, run_key: str) -> None:
        self.s3 = s3_client(env)  # a client of its own: the test's is used meanwhile
        self.bucket, self.run_key = env.bucket, run_key
        self.fences: list[int] = []  # per poll
        self.entries: dict[int, Seen] = {}  # step -> first sight
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="manifest-watch", daemon=True)

    def start(self) -> ManifestWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Ends the polling thread, raises what it met, and looks once more."""
        self.close()
        self._thread.join(timeout=30)
        self.check()
        self._poll()  # one last look, after everything ended

    def check(self) -> None:
        if self._error is not None:
            raise AssertionError(f"the manifest watch failed: {self._error!r}") from self._error

    def fence(self) -> int:
        return self.fences[-1] if self.fences else 0

    def steps(self, attempt: int) -> list[int]:
        return sorted(s for s, seen in self.entries.items() if seen.entry.attempt == attempt)

    def _run(self) -> None:
        deadline = time.monotonic() + WATCH_LIMIT_S
        try:
            while not self._stop.wait(POLL_S) and time.monotonic() < deadline:
                self._poll()
        except BaseException as e:  # surfaced by check() and stop()
            self._error = e

    def _get(self, key: str) -> bytes | None:
        try:
            body: bytes = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return body

    def _poll(self) -> None:
        data = self._get(f"{self.run_key}/manifest.json")
        manifest = parse_run_manifest(data) if data else RunManifest()
        poll = len(self.fences)
        self.fences.append(manifest.fence)
        for entry in manifest.entries:
            if entry.step not in self.entries:
                self.entries[entry.step] = self._record(entry, poll)

    def _record(self, entry: ManifestEntry, poll: int) -> Seen:
        seen = Seen(entry=entry, poll=poll)
        for part in (f"{self.run_key}/{p}" for p in entry.part_prefixes):
            data = self._get(part + "MANIFEST.json")
            assert data is not None, f"{part}MANIFEST.json missing for a committed entry"
            seen.manifests[part + "MANIFEST.json"] = hashlib.sha256(data).hexdigest()
            for f in json.loads(data)["files"]:
                where = part + (f.get("pack") or f["path"])
                seen.objects[part + f["path"]] = (
                    where,
                    f.get("offset", 0) if f.get("pack") else 0,
                    f["size"],
                    f["checksum_algorithm"],
                    f["checksum"],
                )
        return seen


def late_entries(watch: ManifestWatch, attempt: int, fence: int) -> list[int]:
    """Steps of ``attempt`` first seen by a poll after one that already showed a fence past
    ``fence`` (the one that attempt held): commits after the fence moved on."""
    return [
        step
        for step, seen in sorted(watch.entries.items())
        if seen.entry.attempt == attempt and seen.poll and watch.fences[seen.poll - 1] > fence
    ]


def changed_objects(s3: Any, bucket: str, watch: ManifestWatch) -> list[str]:
    """Every object named by a committed entry whose bytes differ now from what was recorded
    when the entry first appeared: checksums computed from the bytes, not the store's word."""
    changed = []
    for seen in watch.entries.values():
        for key, digest in seen.manifests.items():
            data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            if hashlib.sha256(data).hexdigest() != digest:
                changed.append(key)
        for key, (where, offset, size, algorithm, recorded) in seen.objects.items():
            whole = s3.get_object(Bucket=bucket, Key=where)["Body"].read()
            data = whole[offset : offset + size] if where != key else whole
            if (
                len(data) != size
                or checksum.digest(checksum.algorithm(algorithm), data) != recorded
            ):
                changed.append(key)
    return changed


# ---------------------------------------------------------------------------------------------
# the node of attempt 1


def cut_off(core: Any, handle: RunnerHandle) -> None:
    """Partitions the node from the API server; cordoned, so attempt 2 goes elsewhere."""
    handle.partition()
    time.sleep(0.5)  # a status write already under way may still land; then nothing does
    core.patch_node(handle.node, {"spec": {"unschedulable": True}})
    mark_unknown(core, handle.node)


def reconnect(core: Any, handle: RunnerHandle) -> None:
    handle.heal()
    core.patch_node(handle.node, {"spec": {"unschedulable": False}})


def saved_steps(handle: RunnerHandle, namespace: str, pod: str) -> list[int]:
    """The complete checkpoint folders the pod's trainer has written on its node."""
    folder = handle.pod_dir(namespace, pod) / "volumes" / CHECKPOINT_VOLUME
    return sorted(
        int(p.parent.name.removeprefix("checkpoint-"))
        for p in folder.glob(f"checkpoint-*/{COMPLETE_MARKER}")
    )


# ---------------------------------------------------------------------------------------------


class Scene:
    """One run, its two nodes (``a`` runs attempt 1 and is partitioned), the watch."""

    def __init__(self, runs: Runs, env: LocalEnv, prefix: str, loss_dir: Path) -> None:
        self.runs, self.env, self.loss_dir, self.name = runs, env, loss_dir, "split"
        self.run_key = f"{prefix}/{runs.namespace}/{self.name}"
        self.watch = ManifestWatch(env, self.run_key)

    def pod(self, attempt: int) -> str:
        return f"{self.name}-{attempt}"

    def step(self, attempt: int) -> int:
        return max(losses(self.loss_dir / f"loss-{attempt}.jsonl"), default=0)

    def first_step(self, attempt: int) -> int:
        return min(losses(self.loss_dir / f"loss-{attempt}.jsonl"), default=0)

    def wait_attempt(self, attempt: int) -> str:
        """Waits for the attempt's pod to run; returns its node."""
        self.runs.wait_status(
            self.name,
            lambda s: s.get("attempt") == attempt and s.get("activePod") == self.pod(attempt),
            120,
            f"attempt {attempt} started",
        )
        return str(self.runs.wait_pod_running(self.pod(attempt), 60).spec.node_name)

    def wait_committed(self, attempt: int, timeout_s: float = 120) -> list[int]:
        def committed() -> list[int]:
            self.watch.check()
            return self.watch.steps(attempt)

        return wait_for(committed, timeout_s, f"a checkpoint of attempt {attempt} committed")


def overlap(scene: Scene, a: RunnerHandle) -> list[int]:
    """Attempt 2 is training: waits until attempt 1 has trained on for OVERLAP_S after attempt
    2's first step, its sync sidecar still up. Returns the steps attempt 1 saved meanwhile."""
    ns, pod = scene.runs.namespace, scene.pod(1)
    wait_for(lambda: scene.step(2), 120, "attempt 2 training")
    started, before = time.monotonic(), scene.step(1)
    while time.monotonic() < started + OVERLAP_S:
        scene.watch.check()
        time.sleep(1)
    at_overlap = scene.step(1)
    wait_for(lambda: scene.step(1) > at_overlap, 10, f"attempt 1 training {OVERLAP_S}s on")
    for container in (TRAINER_CONTAINER, SYNC_CONTAINER):
        pid = a.pid_of(ns, pod, container)
        assert pid and pid_alive(pid), f"attempt 1's {container} stopped while partitioned"
    saved = [s for s in saved_steps(a, ns, pod) if s > before]
    sync_log = a.log_of(ns, pod, SYNC_CONTAINER).splitlines()
    print(
        f"attempt 1 trained steps {before}..{scene.step(1)} and saved {saved} while attempt 2 "
        "ran; its sync sidecar's log ends with:\n" + "\n".join(sync_log[-12:])
    )
    return saved


def through_partition(
    scene: Scene, nodes: list[RunnerHandle], core: Any
) -> tuple[dict[str, Any], list[int], int]:
    """Attempt 1 runs and commits; its node is cut off; attempt 2 runs on the other node while
    attempt 1 trains on; the partition heals; the run ends and attempt 1's processes stop.
    Returns the run's final status, the steps attempt 1 saved while attempt 2 ran, and the
    fence attempt 1 held."""
    ns = scene.runs.namespace
    node = scene.wait_attempt(1)
    a = next(h for h in nodes if h.node == node)
    b = next(h for h in nodes if h.node != node)
    scene.wait_committed(1)
    held = scene.watch.fence()
    try:
        cut_off(core, a)
        assert scene.wait_attempt(2) == b.node
        saved = overlap(scene, a)
        trainer = a.pid_of(ns, scene.pod(1), TRAINER_CONTAINER)
    finally:
        reconnect(core, a)
    status = scene.runs.wait_status(
        scene.name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300, "the run to end"
    )
    wait_for(
        lambda: (
            not a.pid_of(ns, scene.pod(1), SYNC_CONTAINER) and not (trainer and pid_alive(trainer))
        ),
        GRACE_S + 15,
        "attempt 1's processes stopped after the heal",
    )
    return status, saved, held


def test_partitioned_attempt_commits_nothing_and_changes_no_committed_byte(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    core_v1: Any,
    s3: Any,
    tmp_path: Path,
    partition_reference: tuple[bytes, dict[int, float]],
) -> None:
    weights, reference_losses = partition_reference
    scene = Scene(runs, localenv, prefix, tmp_path)
    runs.create(
        partition_run(scene.name, localenv, prefix, tmp_path, [h.node for h in runner_nodes])
    )
    scene.watch.start()
    try:
        status, saved, held = through_partition(scene, runner_nodes, core_v1)
    finally:
        scene.watch.close()
    scene.watch.stop()

    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["preemptions"], status["restarts"]) == (2, 1, 0), status
    assert not status.get("badCheckpoints"), status
    assert not [e for e in runs.events(scene.name) if e.reason == R.CHECKPOINT_BAD]
    assert scene.watch.fence() > held, "the fence never moved past attempt 1's"
    assert late_entries(scene.watch, 1, held) == [], "attempt 1 committed after the fence moved"
    assert changed_objects(s3, localenv.bucket, scene.watch) == []
    both = sorted(set(saved) & set(scene.watch.steps(2)))
    assert len(both) >= 3, f"attempt 1 saved {saved}, attempt 2 committed {scene.watch.steps(2)}"

    assert MAX_STEPS in scene.watch.entries, f"step {MAX_STEPS} never committed"
    final = scene.watch.entries[MAX_STEPS].entry
    assert final.attempt == 2
    part = f"{scene.run_key}/{final.part_prefixes[0]}"
    assert read_committed(s3_reader(s3, localenv.bucket), part, "model.safetensors") == weights
    trained = losses(tmp_path / "loss-2.jsonl")
    assert sorted(trained) == list(range(scene.first_step(2), MAX_STEPS + 1))
    assert all(trained[s] == reference_losses[s] for s in trained)
    print(
        f"attempt 2 resumed from step {scene.first_step(2) - 1}; steps both attempts saved: "
        f"{both}; committed: attempt 1 {scene.watch.steps(1)}, attempt 2 {scene.watch.steps(2)}"
    )
