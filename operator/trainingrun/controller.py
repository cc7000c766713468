"""The operator: thin kopf handlers around ``trainingrun.decide``.

Every trigger (a TrainingRun event, an event of one of its pods, a node going NotReady, gone or
tainted with a notice, a periodic tick) leads to one ``Reconciler.reconcile(namespace, name)``:
gather the run, its current pod, that pod's node and the newest committed checkpoint; call the
pure ``plan()``; write the status once; then delete or create pods; then post Events.
Passes for one run are serialised by a lock; passes for different runs run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import heapq
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from trainingrun import api
from trainingrun.api import CheckpointRef, TrainingRunSpec, TrainingRunStatus
from trainingrun.contract import ANNOTATION_NOTICE as NOTICE_ANNOTATION
from trainingrun.contract import LABEL_ATTEMPT, LABEL_RUN
from trainingrun.decide.classify import classify, node_not_ready, node_notice
from trainingrun.decide.pod import (
    AgentSettings,
    RunRef,
    build_pod,
    owned_by,
    pod_name,
    resume_of,
    run_prefix,
)
from trainingrun.decide.reconcile import Observed, invalid_spec, is_finished, plan, started
from trainingrun.kube import Forbidden, Invalid, Kube, load_config
from trainingrun.manifest import ManifestError, RunManifest
from trainingrun.opmetrics import OperatorMetrics
from trainingrun.storage import (
    CredentialsSecretError,
    Location,
    StorageError,
    Store,
    choose_checkpoint,
    make_client,
    parse_uri,
    read_run_manifest,
    secret_credentials,
)

log = logging.getLogger("trainingrun.operator")

# Credentials are re-read this often, so a rotated or newly created Secret is picked up.
SECRET_TTL_SECONDS = 30.0


@dataclass(frozen=True)
class OperatorSettings:
    agent: AgentSettings
    # How often every run is looked at even without events: backoff expiry, checkpoint refresh.
    resync_seconds: float = 10.0
    # How often a running attempt's latest checkpoint is re-read from the bucket manifest.
    checkpoint_refresh_seconds: float = 15.0

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        agent = AgentSettings(
            image=env.get("TRAININGRUN_AGENT_IMAGE", AgentSettings.image),
            image_pull_policy=env.get("TRAININGRUN_AGENT_PULL_POLICY", "IfNotPresent"),
        )
        return cls(
            agent=agent,
            resync_seconds=float(env.get("TRAININGRUN_RESYNC_SECONDS", "10")),
            checkpoint_refresh_seconds=float(
                env.get("TRAININGRUN_CHECKPOINT_REFRESH_SECONDS", "15")
            ),
        )


def _rv(obj: Mapping[str, Any]) -> int:
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else -1


def _pick(obj: Mapping[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj and k in obj}


# How soon the create of an attempt's pod is tried again while its name is taken, and how often
# the PodNameTaken Event is repeated meanwhile.
NAME_TAKEN_RETRY_SECONDS = 5.0
NAME_TAKEN_REPEAT_SECONDS = 60.0

_POD_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",  # 0 in a removed pod's last state (classify reads it)
    "ownerReferences",  # whose pod it is: a pod of the same name may be another run's
)


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod a pass reads (classify, resume step, node, attempt label): the spec of
    its containers is most of a pod's size and no pass looks at it again."""
    spec = pod.get("spec") or {}
    return {
        "metadata": _pick(pod.get("metadata"), _POD_METADATA),
        "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
        "status": pod.get("status") or {},
    }


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What classify() reads of a node: Ready and the taints (a node's images and addresses are
    most of its size)."""
    status = node.get("status") or {}
    return {
        "metadata": _pick(node.get("metadata"), ("name", "resourceVersion")),
        "spec": _pick(node.get("spec"), ("taints",)),
        "status": _pick(status, ("conditions",)),
    }


def slim_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run without managedFields and kubectl's copy of the last applied spec."""
    meta = dict(run.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and "kubectl.kubernetes.io/last-applied-configuration" in annotations:
        meta["annotations"] = {
            k: v
            for k, v in annotations.items()
            if k != "kubectl.kubernetes.io/last-applied-configuration"
        }
    return {**run, "metadata": meta}


class Cache:
    """The newest state seen of each object, from watch events and from the answers to the
    operator's own writes (like an informer's store): a pass reads it instead of the API.
    An older resourceVersion never replaces a newer one. ``slim`` keeps of each object only
    what passes read."""

    def __init__(
        self, slim: Callable[[Mapping[str, Any]], dict[str, Any]], max_gone: int = 10000
    ) -> None:
        self._slim = slim
        self._lock = threading.Lock()
        self._live: dict[Any, dict[str, Any]] = {}
        self._gone: OrderedDict[Any, dict[str, Any]] = OrderedDict()
        self._max_gone = max_gone

    def put(self, key: Any, obj: Mapping[str, Any]) -> None:
        slim = self._slim(obj)
        with self._lock:
            old = self._live.get(key)
            if old is None or _rv(slim) >= _rv(old):
                self._live[key] = slim
            self._gone.pop(key, None)

    def gone(self, key: Any, last: Mapping[str, Any] | None) -> None:
        """The object was deleted; ``last`` is its final state."""
        slim = self._slim(last) if last else {}
        with self._lock:
            self._live.pop(key, None)
            self._gone[key] = slim
            while len(self._gone) > self._max_gone:
                self._gone.popitem(last=False)

    def get(self, key: Any) -> tuple[dict[str, Any] | None, bool]:
        """(object, known): known is False when the cache has never heard of the key."""
        with self._lock:
            if key in self._live:
                return self._live[key], True
            if key in self._gone:
                return None, True
            return None, False

    def seen(self, key: Any, obj: Mapping[str, Any]) -> bool:
        """True when the cache already holds this very version of the object."""
        with self._lock:
            old = self._live.get(key)
            return old is not None and _rv(old) == _rv(obj) >= 0

    def keys(self) -> list[Any]:
        with self._lock:
            return list(self._live)

    def values(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._live.values())

    def last(self, key: Any) -> dict[str, Any] | None:
        with self._lock:
            return self._gone.get(key)


class EventPoster:
    """Posts Events from one thread of its own, in the order they were handed over, so a pass
    never waits for them: the status write, the pod delete and the pod create that follow an
    ending are what a resubmission waits for. A pass hands an Event over only after the status
    write it reports landed. When the API server falls far behind, Events beyond ``capacity``
    are dropped (and counted in the log) rather than held in memory without bound."""

    def __init__(
        self, kube: Kube, metrics: OperatorMetrics | None = None, capacity: int = 2000
    ) -> None:
        self._kube = kube
        self._metrics = metrics
        self._queue: queue.Queue[tuple[dict[str, Any], str, str, str] | None] = queue.Queue(
            capacity
        )
        self._dropped = 0
        self._thread = threading.Thread(target=self._loop, name="trainingrun-events", daemon=True)
        self._thread.start()

    def post(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = run["metadata"]
        target = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid")}}
        if self._metrics:
            self._metrics.transitions.labels(reason=reason).inc()
        try:
            self._queue.put_nowait((target, type_, reason, message))
        except queue.Full:
            self._dropped += 1
            if self._metrics:
                self._metrics.events_dropped.inc()
            if self._dropped % 100 == 1:
                log.warning(
                    "%d Events dropped so far: the API server is not keeping up", self._dropped
                )

    def flush(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` seconds) until every Event handed over was posted."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):  # a daemon thread: it dies with the process
            self._queue.put(None, timeout=1.0)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            run, type_, reason, message = item
            try:
                self._kube.event(run, type_, reason, message)
            except Exception as e:  # Events are best effort; the status is the record
                log.warning(
                    "%s/%s: Event %s not posted: %s",
                    run["metadata"]["namespace"],
                    run["metadata"]["name"],
                    reason,
                    e,
                )
            finally:
                self._queue.task_done()
        self._queue.task_done()


@dataclass
class _RunMemory:
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: bool = False  # a pass is in flight
    dirty: bool = False  # something happened during it: run one more pass after it
    checkpoint_read_at: float = 0.0


class Reconciler:
    def __init__(self, kube: Kube, settings: OperatorSettings) -> None:
        self.kube = kube
        self.settings = settings
        self._memory: dict[tuple[str, str], _RunMemory] = {}
        self._memory_lock = threading.Lock()
        self._stores: dict[tuple[str | None, str | None, str, str], Store] = {}
        self._stores_lock = threading.Lock()
        self.runs = Cache(slim_run)
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, str] | None]] = {}
        self.pods = Cache(slim_pod)
        self.nodes = Cache(slim_node)
        # Notice taint keys runs name beyond the operator-wide ones: a node that gets one needs
        # the passes of the runs with a pod on it (each annotates its own pod).
        self._run_notice_taints: dict[tuple[str, str], frozenset[str]] = {}
        self._notice_lock = threading.Lock()
        # Per run: the PodNameTaken message said last, and when (monotonic).
        self._name_taken_said: dict[tuple[str, str], tuple[str, float]] = {}
        self.metrics = OperatorMetrics()
        self.metrics.count_runs_with(self._phases)
        self.events = EventPoster(kube, self.metrics)

    def memory(self, namespace: str, name: str) -> _RunMemory:
        with self._memory_lock:
            return self._memory.setdefault((namespace, name), _RunMemory())

    def forget(self, namespace: str, name: str) -> None:
        with self._memory_lock:
            self._memory.pop((namespace, name), None)
        self._name_taken_said.pop((namespace, name), None)
        self.runs.gone((namespace, name), None)

    def _phases(self) -> list[str]:
        """The phase of every run in the cache (scraped by the runs-by-phase gauge)."""
        return [
            str((run.get("status") or {}).get("phase") or "Pending") for run in self.runs.values()
        ]

    def is_old_attempt(self, namespace: str, run: str, pod: Mapping[str, Any]) -> bool:
        """A pod of an attempt before the run's current one (by the cached status)."""
        cached, _ = self.runs.get((namespace, run))
        current = int(((cached or {}).get("status") or {}).get("attempt") or 0)
        label = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT, "")
        return label.isdigit() and current > 0 and int(label) < current

    def _get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        run, known = self.runs.get((namespace, name))
        if not known:
            run = self.kube.get_run(namespace, name)
            if run is not None:
                self.runs.put((namespace, name), run)
        return run

    def _get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or for a deleted pod its last state when that state says it ended (an
        evicted pod is gone before a pass can read why)."""
        key = (namespace, name)
        pod, known = self.pods.get(key)
        if pod is not None:
            return pod
        if known:
            return self.pods.last(key)
        pod = self.kube.get_pod(namespace, name)
        if pod is not None:
            self.pods.put(key, pod)
        return pod

    def _get_node(self, name: str) -> tuple[dict[str, Any] | None, bool]:
        """(node, deleted)."""
        node, known = self.nodes.get(name)
        if known:
            return node, node is None
        node = self.kube.get_node(name)
        if node is not None:
            self.nodes.put(name, node)
        return node, node is None

    # -- storage ---------------------------------------------------------------------------

    def store_for(self, namespace: str, spec: TrainingRunSpec) -> tuple[Store, Location]:
        storage = spec.checkpoint.storage
        creds = None
        if storage.credentials_secret:
            data = self._secret(namespace, storage.credentials_secret)
            try:
                creds = secret_credentials(namespace, storage.credentials_secret, data)
            except CredentialsSecretError as e:
                raise MissingSecret(str(e)) from e
        loc = parse_uri(storage.uri)
        fingerprint = (
            hashlib.sha256(f"{creds.access_key}:{creds.secret_key}".encode()).hexdigest()
            if creds
            else ""
        )
        key = (storage.endpoint, storage.region, fingerprint, loc.bucket)
        store = self._stores.get(key)
        if store is None:
            # One at a time: botocore loads and parses the S3 service model for the first client
            # (~15 MB), and workers that all start at once would each load their own copy
            # (~90 MB more peak RSS with 8 workers).
            with self._stores_lock:
                store = self._stores.get(key)
                if store is None:
                    store = Store(make_client(storage.endpoint, storage.region, creds), loc.bucket)
                    self._stores[key] = store
        return store, loc

    def _secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, read at most once per ``SECRET_TTL_SECONDS`` per Secret: every
        pass needs the credentials, and reading them each time loads the API server."""
        key = (namespace, name)
        now = time.monotonic()
        cached = self._secrets.get(key)
        if cached and now - cached[0] < SECRET_TTL_SECONDS:
            return cached[1]
        data = self.kube.get_secret_data(namespace, name)
        self._secrets[key] = (now, data)
        return data

    def _read_manifest(self, ref: RunRef) -> RunManifest | None:
        store, _ = self.store_for(ref.namespace, ref.spec)
        return read_run_manifest(store, parse_uri(run_prefix(ref)))

    @staticmethod
    def _latest(ref: RunRef, manifest: RunManifest | None) -> CheckpointRef | None:
        entry = manifest.latest if manifest else None
        if entry is None:
            return None
        return CheckpointRef(
            step=entry.step, uri=f"{run_prefix(ref)}/{entry.prefix}", time=entry.committed
        )

    # -- one pass ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Passes for one run until nothing new happened during the last; returns seconds
        until it wants another, if any. At most one pass per run is in flight: a trigger that
        arrives meanwhile marks the run dirty and returns at once (a work queue's semantics),
        so a burst of events for one run costs two passes, not one per event."""
        mem = self.memory(namespace, name)
        with mem.lock:
            if mem.running:
                mem.dirty = True
                return None
            mem.running = True
        try:
            while True:
                with self.metrics.pass_seconds.time():
                    again = self._reconcile(namespace, name, mem)
                with mem.lock:
                    if not mem.dirty:
                        mem.running = False
                        return again
                    mem.dirty = False
        except BaseException:
            with mem.lock:
                mem.running = mem.dirty = False
            raise

    def _observe_attempt(
        self,
        namespace: str,
        name: str,
        uid: str,
        status: TrainingRunStatus,
        spec: TrainingRunSpec,
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
        """(pod of the current attempt, its node, node deleted). A deleted pod is given by its
        last state when that state says how it ended, else as None; a pod of that name that is
        not this run's (a deleted run's of the same name, going away) as None."""
        current = pod_name(name, status.attempt)
        if not status.attempt or (
            status.active_pod != current and not self.pods.get((namespace, current))[1]
        ):
            # Not created yet as far as the status knows; a create answers 409 if it was.
            return None, None, False
        pod = self._get_pod(namespace, current)
        if pod is not None and not pod.get("metadata"):
            pod = None  # deleted, last state unknown
        if pod is not None and not owned_by(pod, uid):
            pod = None
        if pod is not None and self.pods.last((namespace, current)) is pod:
            pod = pod if self._ended(pod, spec) else None
        node_name = ((pod or {}).get("spec") or {}).get("nodeName")
        if not node_name:
            return pod, None, False
        node, node_deleted = self._get_node(node_name)
        return pod, node, node_deleted

    def _reconcile(self, namespace: str, name: str, mem: _RunMemory) -> float | None:
        run = self._get_run(namespace, name)
        if run is None:
            self._remember_notice_taints((namespace, name), None)
            return None
        meta = run["metadata"]
        if meta.get("deletionTimestamp"):
            self._remember_notice_taints((namespace, name), None)
            return None  # being deleted: its pods go with it (owner references)
        generation = int(meta.get("generation") or 0)
        raw_status = run.get("status") or {}
        status = TrainingRunStatus.model_validate(raw_status)
        if is_finished(status):
            self._remember_notice_taints((namespace, name), None)
            return None
        now = datetime.now(UTC)
        try:
            spec = TrainingRunSpec.model_validate(run.get("spec") or {})
        except ValidationError as e:
            err = e.errors()[0]
            where = "spec." + ".".join(str(p) for p in err["loc"])
            return self._fail_invalid(run, status, generation, f"{where}: {err['msg']}", now)
        ref = RunRef(name=name, namespace=namespace, uid=meta["uid"], spec=spec)
        self._remember_notice_taints((namespace, name), spec)

        pod, node, node_deleted = self._observe_attempt(namespace, name, meta["uid"], status, spec)
        self._pass_notice_on(pod, node, spec)

        latest, manifest, manifest_read = None, None, False
        ended = (pod is None and status.active_pod) or (
            pod is not None and self._ended(pod, spec, node, node_deleted)
        )
        refresh_due = (
            time.monotonic() - mem.checkpoint_read_at >= self.settings.checkpoint_refresh_seconds
        )
        if ended or refresh_due or status.attempt == 0:
            try:
                manifest = self._read_manifest(ref)
                manifest_read = True
                latest = self._latest(ref, manifest)
                mem.checkpoint_read_at = time.monotonic()
            except MissingSecret as e:
                if status.attempt == 0:
                    return self._fail_invalid(
                        run, status, generation, str(e), now, reason="MissingSecret"
                    )
                # A running attempt keeps the credentials it started with: it is supervised to
                # its end, which may be a success; the next attempt's pod fails the run on it.
                log.warning("%s/%s: cannot read the bucket manifest: %s", namespace, name, e)
            except (StorageError, ManifestError) as e:
                log.warning("%s/%s: cannot read the bucket manifest: %s", namespace, name, e)

        obs = Observed(
            name=name,
            generation=generation,
            spec=spec,
            status=status,
            pod=pod,
            node=node,
            node_deleted=node_deleted,
            latest=latest,
            now=now,
        )
        p = plan(obs)
        self._write_status(namespace, name, raw_status, p.status)
        for ev in p.events:
            self.events.post(run, ev.type, ev.reason, ev.message)
        if p.delete_pod and self.pods.get((namespace, p.delete_pod))[0] is not None:
            self.kube.delete_pod(
                namespace,
                p.delete_pod,
                grace_seconds=0 if node_deleted or (node and node_not_ready(node)) else None,
            )
        if p.create_attempt is None:
            return p.requeue_after
        if p.create_attempt != p.status.attempt:
            raise AssertionError("plan asked for a pod of another attempt than the status records")
        # The status write above landed: only now may the pod of the new attempt exist.
        return self._start_attempt(run, ref, obs, p.status, manifest, manifest_read)

    def _pass_notice_on(
        self, pod: Mapping[str, Any] | None, node: Mapping[str, Any] | None, spec: TrainingRunSpec
    ) -> None:
        """Annotates a running pod whose node carries one of the run's own notice taints (the
        node handler does it for the operator-wide ones, at once); the sidecar's cue."""
        if pod is None or node is None:
            return
        meta = pod.get("metadata") or {}
        if NOTICE_ANNOTATION in (meta.get("annotations") or {}):
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        notice = node_notice(node, spec.preemption.notice_taints)
        if notice:
            self.kube.annotate_pod(meta["namespace"], meta["name"], {NOTICE_ANNOTATION: notice})

    def _ended(
        self,
        pod: Mapping[str, Any],
        spec: TrainingRunSpec,
        node: Mapping[str, Any] | None = None,
        node_deleted: bool = False,
    ) -> bool:
        outcome = classify(
            pod,
            node=node,
            node_deleted=node_deleted,
            notice_taints=spec.preemption.notice_taints,
            now=datetime.now(UTC),
        )
        return outcome.ended

    def _start_attempt(
        self,
        run: dict[str, Any],
        ref: RunRef,
        obs: Observed,
        status: TrainingRunStatus,
        manifest: RunManifest | None,
        manifest_read: bool,
    ) -> float | None:
        """Creates the pod of ``status.attempt`` from the newest usable checkpoint; ``manifest``
        is the run manifest this pass already read (None: there is none yet), when
        ``manifest_read``."""
        namespace, name = ref.namespace, ref.name
        try:
            store, _ = self.store_for(namespace, ref.spec)
            loc, bad = parse_uri(run_prefix(ref)), set(status.bad_checkpoints)
            if manifest_read:
                choice = choose_checkpoint(store, loc, bad, manifest)
            else:
                choice = choose_checkpoint(store, loc, bad)
        except MissingSecret as e:
            return self._fail_invalid(
                run, status, obs.generation, str(e), obs.now, reason="MissingSecret"
            )
        except (StorageError, ManifestError) as e:
            # Without the manifest the newest checkpoint is unknown; starting fresh would lose
            # work, so wait for the bucket instead.
            log.warning("%s/%s: cannot choose a checkpoint, retrying: %s", namespace, name, e)
            self.events.post(run, "Warning", "StorageUnavailable", f"cannot read checkpoints: {e}")
            return self.settings.resync_seconds
        for step, why in choice.rejected:
            self.events.post(
                run, "Warning", "CheckpointSkipped", f"checkpoint {step} not used: {why}"
            )
        resume = resume_of(ref, choice.entry.step) if choice.entry else None
        pod = build_pod(ref, status.attempt, resume, self.settings.agent)
        try:
            created, fresh = self.kube.create_pod(pod)
            if not fresh and not owned_by(created, ref.uid):
                return self._pod_name_taken(run, created)
            if fresh:
                self.metrics.pods_created.inc()
            self.pods.put((namespace, created["metadata"]["name"]), created)
        except Forbidden as e:
            # Quota, a terminating namespace, an admission webhook: not the spec's fault.
            log.warning(
                "%s/%s: pod %s not created: %s", namespace, name, pod_name(name, status.attempt), e
            )
            self.events.post(run, "Warning", "PodForbidden", str(e))
            return self.settings.resync_seconds
        except Invalid as e:
            return self._fail_invalid(run, status, obs.generation, f"pod rejected: {e}", obs.now)
        new, ev = started(status, obs, created)
        self._write_status(namespace, name, status.model_dump(by_alias=True, mode="json"), new)
        self.events.post(run, ev.type, ev.reason, ev.message)
        return None

    def _pod_name_taken(self, run: dict[str, Any], pod: Mapping[str, Any]) -> float:
        """The attempt's pod name is taken by a pod that is not this run's: wait for it to go
        (a deleted run's pod of the same name is removed by the garbage collector)."""
        meta = pod.get("metadata") or {}
        owners = [f"{r.get('kind')}/{r.get('name')}" for r in meta.get("ownerReferences") or []]
        whose = f"owned by {', '.join(owners)}" if owners else "not owned by this run"
        going = (
            "being deleted; waiting"
            if meta.get("deletionTimestamp")
            else "delete it or rename the run"
        )
        message = f"pod {meta.get('name')} exists and is not this run's ({whose}): {going}"
        rmeta = run["metadata"]
        key = (rmeta["namespace"], rmeta["name"])
        now = time.monotonic()
        said, at = self._name_taken_said.get(key, ("", 0.0))
        # Said again once a minute while it lasts, not at every retry; at once when it changes.
        if said != message or now - at >= NAME_TAKEN_REPEAT_SECONDS:
            self._name_taken_said[key] = (message, now)
            log.warning("%s/%s: %s", rmeta["namespace"], rmeta["name"], message)
            self.events.post(run, "Warning", "PodNameTaken", message)
        # The other pod is not watched (no run label, or another run's UID): poll for it to go.
        return min(self.settings.resync_seconds, NAME_TAKEN_RETRY_SECONDS)

    def _fail_invalid(
        self,
        run: dict[str, Any],
        status: TrainingRunStatus,
        generation: int,
        message: str,
        now: datetime,
        reason: str = "InvalidSpec",
    ) -> float | None:
        """Ends the run as Failed with a reason that names the problem; never retried."""
        new = invalid_spec(status, generation, message, now)
        if reason != "InvalidSpec":
            new = new.model_copy(update={"reason": reason})
        meta = run["metadata"]
        self._write_status(meta["namespace"], meta["name"], run.get("status") or {}, new)
        self.events.post(run, "Warning", reason, message)
        return None

    def _write_status(
        self, namespace: str, name: str, before: Mapping[str, Any], after: TrainingRunStatus
    ) -> None:
        new = after.model_dump(by_alias=True, mode="json")
        old = TrainingRunStatus.model_validate(dict(before)).model_dump(by_alias=True, mode="json")
        if new == old:
            return
        # Merge patch: keys that became None are removed.
        updated = self.kube.patch_run_status(namespace, name, new)
        if updated is not None:
            self.runs.put((namespace, name), updated)

    # -- nodes --------------------------------------------------------------------------------

    def node_matters(self, node: Mapping[str, Any] | None) -> bool:
        """The node is gone, NotReady or carries a notice taint (operator-wide or a run's)."""
        with self._notice_lock:
            runs_keys = set().union(*self._run_notice_taints.values())
        return (
            node is None
            or node_not_ready(node)
            or node_notice(node, [*api.DEFAULT_NOTICE_TAINTS, *_extra_notice_taints(), *runs_keys])
            is not None
        )

    def _remember_notice_taints(self, key: tuple[str, str], spec: TrainingRunSpec | None) -> None:
        own = frozenset(spec.preemption.notice_taints) if spec else frozenset()
        own -= {*api.DEFAULT_NOTICE_TAINTS, *_extra_notice_taints()}
        with self._notice_lock:
            if own:
                self._run_notice_taints[key] = own
            else:
                self._run_notice_taints.pop(key, None)

    def node_changed(self, node: Mapping[str, Any] | None, name: str) -> list[tuple[str, str]]:
        """Runs with a pod on this node that need a pass: the node is gone, NotReady or noticed.
        Pods on a node with a notice taint get the notice annotation (the sidecar's cue)."""
        if not self.node_matters(node):
            return []
        notice = node_notice(node, api.DEFAULT_NOTICE_TAINTS + _extra_notice_taints())
        runs = []
        for pod in self.kube.run_pods_on_node(name, LABEL_RUN):
            meta = pod["metadata"]
            if notice and NOTICE_ANNOTATION not in (meta.get("annotations") or {}):
                self.kube.annotate_pod(meta["namespace"], meta["name"], {NOTICE_ANNOTATION: notice})
            runs.append((meta["namespace"], meta["labels"][LABEL_RUN]))
        return runs


class MissingSecret(Exception):
    """The credentials Secret a run names does not exist or lacks a key."""


def _extra_notice_taints() -> list[str]:
    return [t for t in os.environ.get("TRAININGRUN_NOTICE_TAINTS", "").split(",") if t]


# ---------------------------------------------------------------------------------------------
# kopf wiring

_reconciler: Reconciler | None = None


def reconciler() -> Reconciler:
    if _reconciler is None:
        raise RuntimeError("operator not started")
    return _reconciler


class Scheduler:
    """Passes that are due later (a backoff, a retry) and the periodic resync of every run, on
    one thread with a heap; passes themselves run on a small worker pool. No finalizer and no
    thread per waiting run."""

    def __init__(self, run_pass: Any, resync_seconds: float, workers: int = 4) -> None:
        self._run_pass = run_pass
        self._resync = resync_seconds
        self._heap: list[tuple[float, tuple[str, str]]] = []
        self._due: dict[tuple[str, str], float] = {}
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="trainingrun-pass")
        self._thread = threading.Thread(
            target=self._loop, name="trainingrun-scheduler", daemon=True
        )
        self._last_resync = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def later(self, delay: float, key: tuple[str, str]) -> None:
        when = time.monotonic() + max(delay, 0.0)
        with self._cv:
            if key in self._due and self._due[key] <= when:
                return  # an earlier pass is already planned
            self._due[key] = when
            heapq.heappush(self._heap, (when, key))
            self._cv.notify()

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            if now - self._last_resync >= self._resync:
                self._last_resync = now
                keys = reconciler().runs.keys()
                for n, key in enumerate(keys):  # spread over the interval
                    self.later(self._resync * n / max(len(keys), 1), key)
            with self._cv:
                while self._heap and self._heap[0][0] <= time.monotonic():
                    when, key = heapq.heappop(self._heap)
                    if self._due.get(key) == when:
                        del self._due[key]
                        self._pool.submit(self._run_pass, *key)
                wait = self._heap[0][0] - time.monotonic() if self._heap else self._resync
                self._cv.wait(timeout=max(0.01, min(wait, self._resync)))


_scheduler: Scheduler | None = None


def _pass(namespace: str, name: str) -> None:
    try:
        again = reconciler().reconcile(namespace, name)
    except Exception:
        log.exception(
            "%s/%s: reconcile failed; retrying after the resync interval", namespace, name
        )
        again = reconciler().settings.resync_seconds
        reconciler().metrics.pass_errors.inc()
    if again is not None and _scheduler is not None:  # 0.0: at once (the next step is due)
        _scheduler.later(again, (namespace, name))


def _enqueue(namespace: str, name: str) -> None:
    """Hands a pass to the scheduler's workers: kopf's threads only record what they saw."""
    if _scheduler is None:
        raise RuntimeError("operator not started")
    _scheduler.later(0.0, (namespace, name))


class _NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps a deep copy of every object's "essence" to find what changed for on.create,
    on.update and on.field handlers, and builds one for every watch event even without such
    handlers. The operator has only on.event handlers: the copy is CPU spent for nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _reconciler  # noqa: PLW0603 - one reconciler per operator process
    settings.posting.enabled = False  # Events are posted by Kube.event, after the status write
    settings.persistence.diffbase_storage = _NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 2  # only node changes call the API from a handler
    # kopf keeps a task per object for this long after its last event, and that task holds the
    # event (a parsed pod is ~30 KB): after a burst over 1000 objects, tens of MB for nothing.
    settings.queueing.idle_timeout = 0.5
    op_settings = OperatorSettings.from_env()
    _reconciler = Reconciler(Kube(load_config()), op_settings)
    # kopf wraps each event's object in views that refer to each other: a reference cycle per
    # event that keeps the parsed object (~30 KB for a pod) until the cycle collector frees it.
    # In a burst they outlive the young generations, and CPython collects the oldest only once
    # it grew by a quarter, counting the ~200k objects of the imported modules: a burst over
    # 1000 objects then held ~100 MB. Frozen, the modules no longer count (the collection after
    # the freeze resets the count), and full collections follow the operator's own garbage.
    gc.collect()
    gc.freeze()
    gc.collect()
    global _scheduler  # noqa: PLW0603
    _scheduler = Scheduler(
        _pass, op_settings.resync_seconds, workers=int(os.environ.get("TRAININGRUN_WORKERS", "8"))
    )
    _scheduler.start()


@kopf.on.cleanup()
def _cleanup(**_: Any) -> None:
    if _scheduler is not None:
        _scheduler.stop()
    if _reconciler is not None:
        _reconciler.events.flush(timeout=5.0)
        _reconciler.events.stop()


# The handlers are coroutines: they only update a cache and hand a pass to the scheduler, which
# takes microseconds, so they run on kopf's event loop instead of a hop through its thread pool.


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def _on_run(type: str, body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
    if not namespace:
        return
    if type == "DELETED":
        reconciler().forget(namespace, name)
        return
    if reconciler().runs.seen((namespace, name), body):
        return  # the echo of the operator's own status write: nothing new
    reconciler().runs.put((namespace, name), body)
    _enqueue(namespace, name)


@kopf.on.event("", "v1", "pods", labels={LABEL_RUN: kopf.PRESENT})
async def _on_pod(type: str, body: kopf.Body, namespace: str | None, **_: Any) -> None:
    run = body["metadata"]["labels"][LABEL_RUN]
    if not namespace:
        return
    key = (namespace, body["metadata"]["name"])
    if type == "DELETED":
        reconciler().pods.gone(key, body)
    else:
        if reconciler().pods.seen(key, body):
            return  # the echo of the operator's own create: the pass that made it saw it
        reconciler().pods.put(key, body)
    if reconciler().is_old_attempt(namespace, run, body):
        return  # the run has moved on to a newer attempt
    _enqueue(namespace, run)


@kopf.on.event("", "v1", "nodes")
async def _on_node(type: str, body: kopf.Body, name: str, **_: Any) -> None:
    node = None if type == "DELETED" else body
    if node is None:
        reconciler().nodes.gone(name, body)
    else:
        reconciler().nodes.put(name, node)
    if not reconciler().node_matters(node):
        return
    # Lists and annotates pods through the API: off the event loop.
    for namespace, run in await asyncio.to_thread(reconciler().node_changed, node, name):
        _enqueue(namespace, run)
