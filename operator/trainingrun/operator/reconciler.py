"""One reconcile pass of one TrainingRun: gather, ``plan()``, apply.

Gather: the run, the pods of its current attempt (one, or a gang's one per rank) and their
nodes (from the caches, read through to the API), and, when an attempt ended, is about to be
warned unprotected or a refresh is due, the bucket manifest. Plan: the pure
``trainingrun.decide.reconcile.plan``. Apply: the status is written and its Events handed to
the sink, a preemption notice is handed on to the attempt's other pods (``decide.notices``), the
pods of older attempts (and those the plan ends) are deleted until they are gone
(``trainingrun.operator.oldpods``; a refused DELETE is retried at a later pass and never stops
the next attempt), and the next attempt is started (``trainingrun.operator.starts``): its fence,
its checkpoint, its pods. A start due at once writes the plan's status with the started
attempt, in one write once the pods exist.

Everything outside is passed in (the Kubernetes wrapper, the stores, the Event sink, the
metrics, the clock), so a unit test drives a ``Reconciler`` against fakes in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from trainingrun.api import TrainingRunSpec, TrainingRunStatus
from trainingrun.checkpoint.manifest import ManifestError
from trainingrun.checkpoint.progress import ProgressError, ProgressRecord
from trainingrun.contract import parse_time
from trainingrun.decide import goodput
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import classify
from trainingrun.decide.gang import Member
from trainingrun.decide.naming import RunRef, member_names, owned_by
from trainingrun.decide.observed import Observed, Plan, attempt_outcome, sooner
from trainingrun.decide.reconcile import plan
from trainingrun.decide.status import is_finished
from trainingrun.decide.unprotected import warns_unprotected
from trainingrun.operator import ledgers
from trainingrun.operator.applier import Applier, WriteApi, storage_refused
from trainingrun.operator.buckets import Checkpoints, MissingSecret, RunStores
from trainingrun.operator.cache import ClusterView, ObjectReader
from trainingrun.operator.events import EventSink
from trainingrun.operator.launch import Launcher
from trainingrun.operator.metrics import OperatorMetrics
from trainingrun.operator.notices import Notices
from trainingrun.operator.oldpods import OldPods
from trainingrun.operator.queues import ObjectApi, Queues, Seen
from trainingrun.operator.settings import OperatorSettings
from trainingrun.operator.starts import Starter
from trainingrun.storage.opener import StorageError, StorageMisconfigured, log_text

log = logging.getLogger("trainingrun.operator")


class KubeApi(ObjectReader, ObjectApi, WriteApi, Protocol):
    """The calls of ``trainingrun.operator.kube.Kube`` the reconciler makes: reads in gather,
    writes through its ``Applier`` only."""


# How often at most the sidecar's last word is looked for after an attempt ended.
LAST_WORD_SECONDS = 5.0


@dataclass
class RunMemory:
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: bool = False  # a pass is in flight
    dirty: bool = False  # something happened during it: run one more pass after it
    checkpoint_read_at: float = float("-inf")
    progress_read_at: float = float("-inf")
    last_word_read_at: float = float("-inf")
    ledger_tried: bool = False  # the ledger's copy was looked for in the run's prefix


class Reconciler:
    def __init__(
        self,
        api: KubeApi,
        stores: RunStores,
        events: EventSink,
        metrics: OperatorMetrics,
        settings: OperatorSettings,
        *,
        notices: Notices | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.stores = stores
        self.events = events
        self.metrics = metrics
        self.settings = settings
        self.view = ClusterView(api)
        self.notices = notices or Notices(api, settings.notice_taints)
        self.applier = Applier(api, self.view, events)
        self.old_pods = OldPods(self.applier, self.view, events, metrics)
        self.launcher = Launcher(self.applier, self.view, metrics, settings, monotonic)
        self.queues = Queues(api, self.applier, monotonic)
        self.starter = Starter(stores, self.launcher, self.applier, settings)
        self._now = now
        self._monotonic = monotonic
        self._memory: dict[tuple[str, str], RunMemory] = {}
        self._memory_lock = threading.Lock()

    def memory(self, namespace: str, name: str) -> RunMemory:
        with self._memory_lock:
            return self._memory.setdefault((namespace, name), RunMemory())

    def forget(self, namespace: str, name: str) -> None:
        with self._memory_lock:
            self._memory.pop((namespace, name), None)
        self.view.runs.gone((namespace, name), None)
        self.old_pods.forget(namespace, name)
        self.launcher.forget(namespace, name)
        self.queues.forget(namespace, name)

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
                    again = self._pass(namespace, name, mem)
                with mem.lock:
                    if not mem.dirty:
                        mem.running = False
                        return again
                    mem.dirty = False
        except BaseException:
            with mem.lock:
                mem.running = mem.dirty = False
            raise

    def _pass(self, namespace: str, name: str, mem: RunMemory) -> float | None:
        run = self.view.run(namespace, name)
        meta = (run or {}).get("metadata") or {}
        status = TrainingRunStatus.model_validate((run or {}).get("status") or {})
        # Gone, being deleted (its pods go with it: owner references) or finished.
        if run is None or meta.get("deletionTimestamp") or is_finished(status):
            self.notices.remember((namespace, name), None)
            if run is None or meta.get("deletionTimestamp"):
                return None
            mem.ledger_tried = ledgers.restore_finished(
                self.stores, self.applier, run, mem.ledger_tried
            )
            self.queues.settle(run, status, Seen(), self.view, self._now())  # Finished
            return self.old_pods.sweep(run, 0, self._now())  # the pods asked to go, until gone
        generation, now = int(meta.get("generation") or 0), self._now()
        try:
            spec = TrainingRunSpec.model_validate(run.get("spec") or {})
        except ValidationError as e:
            err = e.errors()[0]
            where = "spec." + ".".join(str(p) for p in err["loc"])
            self.applier.fail(run, status, R.INVALID_SPEC, f"{where}: {err['msg']}", now)
            return None
        ref = RunRef(name=name, namespace=namespace, uid=meta["uid"], spec=spec)
        if storage_refused(self.applier, self.settings, run, status, ref, now):
            return None
        self.notices.remember((namespace, name), spec)

        obs, begun, ended, queued = self._observe(run, ref, status, generation, now)
        # An attempt's end, and the warning that it committed nothing, are judged on the bucket
        # manifest itself rather than the last refresh (up to checkpoint_refresh_seconds old).
        due = ended or (begun and warns_unprotected(obs))
        try:
            seen = self._checkpoints(ref, mem, due=due, first=status.attempt == 0)
        except (MissingSecret, StorageMisconfigured) as e:
            return self.starter.unusable_storage(run, status, e, now)
        # An attempt's end reads its last record whatever the interval, and until the sidecar's
        # last word (published once it stopped, often after the attempt ended) is seen, every
        # LAST_WORD_SECONDS: the trainer's last step for the goodput ledger.
        record = self._progress(ref, mem, seen.read and begun, 0.0 if ended else None)
        last_word = None
        since = self._monotonic() - mem.last_word_read_at
        # Beside the regular reads, which go on showing the running attempt's progress.
        if not ended and since >= LAST_WORD_SECONDS and goodput.awaits_last_word(status, now):
            mem.last_word_read_at = self._monotonic()
            last_word = ledgers.last_word(self.stores, ref)
        ledger, mem.ledger_tried = ledgers.look(self.stores, ref, status, mem.ledger_tried)
        obs = replace(obs, latest=seen.latest, progress=record, ledger=ledger, last_word=last_word)
        p = plan(obs)  # the one plan of the pass
        again = self._apply(run, ref, obs, p, seen.seen)
        if goodput.closed(p.status) != goodput.closed(status):
            ledgers.write(self.stores, ref, p.status)  # an attempt ended or was corrected
        self.queues.create(run, queued)  # the run's missing Workload
        self.queues.settle(run, p.status, queued, self.view, self._now())
        return sooner(again, self.queues.poll_after(queued, p.status))

    def _observe(
        self,
        run: dict[str, Any],
        ref: RunRef,
        status: TrainingRunStatus,
        generation: int,
        now: datetime,
    ) -> tuple[Observed, bool, bool, Seen]:
        """The current attempt's pods and nodes, whether it began and ended, and Kueue's
        answer (asked once it is known whether an attempt runs under the Workload's admission,
        which it keeps, or the next would start: only under an admission given for the
        current template)."""
        gang = observe_gang(self.view, ref, status, now)
        first = gang[0]
        obs = Observed(
            name=ref.name,
            generation=generation,
            spec=ref.spec,
            status=status,
            pod=first.pod,
            node=first.node,
            node_deleted=first.node_deleted,
            latest=None,
            now=now,
            peers=tuple(gang[1:]),
            created=parse_time((run.get("metadata") or {}).get("creationTimestamp")),
        )
        begun = bool(status.active_pod) or all(m.pod is not None for m in gang)
        ended = begun and attempt_outcome(obs).ended
        queued = self.queues.observe(run, ref, status, self.settings.agent, begun and not ended)
        return replace(obs, queue=queued.queue), begun, ended, queued

    def _apply(
        self,
        run: dict[str, Any],
        ref: RunRef,
        obs: Observed,
        p: Plan,
        seen: tuple[bytes, str] | None = None,
    ) -> float | None:
        """The plan's writes, through the applier, in its order (``trainingrun.operator.applier``):
        status, Events and annotations, then the pods that go, then the next attempt's. ``seen``:
        the bucket manifest as this pass read it, if it did.

        A start due at once (no backoff, no old sidecar still committing, no pod the plan ends,
        nothing to annotate) writes the plan's status together with the started attempt, once
        its pods exist: one status write instead of two. Stopped between the create and that
        write, the next operator judges the same ending again and finds the pods by name (a
        create answers 409 and adopts them): no attempt number is skipped, no second pod
        made."""
        starting = p.create_attempt is not None
        if starting and p.create_attempt != p.status.attempt:
            raise AssertionError("plan asked for a pod of another attempt than the status records")
        # The fence waits for an old pod's sidecar still committing its trainer's last save.
        wait = None
        if starting:
            wait = self.old_pods.drain_wait(
                ref.namespace, ref.name, ref.uid, p.status.attempt, obs.now
            )
        at_once = (
            starting and wait is None and not p.delete_pods and not p.annotate and not p.notice
        )
        if not at_once:
            self.applier.record(run, ref, p)
        # Every pod of an older attempt, and the one the plan ends, until gone; never raises.
        again = self.old_pods.sweep(run, p.status.attempt, obs.now, also=p.delete_pods)
        if not starting:
            return sooner(p.requeue_after, again)
        if wait is not None:
            return sooner(wait, again)
        return sooner(self.starter.start(run, ref, obs, p, seen, recorded=not at_once), again)

    def _checkpoints(self, ref: RunRef, mem: RunMemory, due: bool, first: bool) -> Checkpoints:
        """The run manifest when ``due`` (an attempt ended, or is about to be warned
        unprotected), none started yet (``first``), or a refresh is due. Raises MissingSecret
        only when ``first``: a running attempt keeps the credentials it started with and is
        supervised to its end, which may be a success; the next attempt's start fails the run
        on it."""
        refresh = self._monotonic() - mem.checkpoint_read_at
        if not (due or first) and refresh < self.settings.checkpoint_refresh_seconds:
            return Checkpoints()
        try:
            seen = self.stores.checkpoints(ref)
        except MissingSecret as e:
            if first:
                raise
            log.warning("%s/%s: cannot read the bucket manifest: %s", ref.namespace, ref.name, e)
            return Checkpoints()
        except (StorageError, ManifestError) as e:
            why = log_text(e)
            log.warning("%s/%s: cannot read the bucket manifest: %s", ref.namespace, ref.name, why)
            return Checkpoints()
        mem.checkpoint_read_at = self._monotonic()
        return seen

    def _progress(
        self,
        ref: RunRef,
        mem: RunMemory,
        refreshed: bool,
        every: float | None = None,
    ) -> ProgressRecord | None:
        """The running attempt's progress record, read along with a manifest refresh
        (``refreshed``) at most once per ``progress_refresh_seconds`` (``every``, when given:
        0 at an attempt's end, a few seconds while its last word is awaited): its reads are
        never more than the periodic passes' (``resync_rate``) and the attempts' ends, whatever
        the number of runs. None when not read (the status keeps what it shows) or unreadable
        (display only: logged, no more)."""
        since = self._monotonic() - mem.progress_read_at
        interval = self.settings.progress_refresh_seconds if every is None else every
        if not refreshed or since < interval:
            return None
        mem.progress_read_at = self._monotonic()
        try:
            return self.stores.read_progress(ref)
        except (MissingSecret, StorageError, ProgressError) as e:
            why = log_text(e) if isinstance(e, StorageError) else str(e)
            log.info("%s/%s: no progress shown: %s", ref.namespace, ref.name, why)
            return None


def ended(
    pod: Mapping[str, Any],
    spec: TrainingRunSpec,
    now: datetime,
    node: Mapping[str, Any] | None = None,
    node_deleted: bool = False,
) -> bool:
    outcome = classify(
        pod,
        node=node,
        node_deleted=node_deleted,
        notice_taints=spec.preemption.notice_taints,
        now=now,
    )
    return outcome.ended


def observe_gang(
    view: ClusterView, ref: RunRef, status: TrainingRunStatus, now: datetime
) -> list[Member]:
    """The pods of the current attempt by rank (one unless a gang), each with its node."""
    names = member_names(ref, status.attempt)
    if not status.attempt:
        return [Member(name, None) for name in names]
    recorded = status.active_pod == names[0]
    return [observe_pod(view, ref, name, recorded, now) for name in names]


def observe_pod(view: ClusterView, ref: RunRef, name: str, recorded: bool, now: datetime) -> Member:
    """One pod of the attempt and its node. A deleted pod is given by its last state when that
    state says how it ended, else as None; a pod of that name that is not this run's (a deleted
    run's of the same name, going away) as None. Not ``recorded`` (the status does not say the
    attempt started) and never seen: not created yet (a create answers 409 if it was)."""
    namespace = ref.namespace
    if not recorded and not view.pods.get((namespace, name))[1]:
        return Member(name, None)
    pod = view.pod(namespace, name)
    if pod is not None and (not pod.get("metadata") or not owned_by(pod, ref.uid)):
        pod = None  # deleted with its last state unknown, or not this run's
    if pod is not None and view.pods.last((namespace, name)) is pod:
        pod = pod if ended(pod, ref.spec, now) else None
    node_name = ((pod or {}).get("spec") or {}).get("nodeName")
    if not node_name:
        return Member(name, pod)
    node, node_deleted = view.node(node_name)
    return Member(name, pod, node, node_deleted)
