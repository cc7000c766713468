"""The Reconciler (gather, plan, apply) driven against in-memory fakes of the Kubernetes wrapper
and the bucket (tests/unit/fakes.py), with a clock the test moves. Covers:

- a fresh start creates pod <run>-1 with no restore and records it (status, condition, Event),
  and a second pass changes nothing;
- a failure is recorded with a backoff and no pod; once the backoff passed, the next attempt
  resumes from the newest committed checkpoint and spends the restart budget;
- a preemption resubmits in the same pass, without backoff, and spends no restart;
- the operator stopped between the two steps of the attempt counter (before the create, or after
  it but before the status write): a new Reconciler makes exactly one pod for the attempt;
- a pod holding the attempt's name that is not the run's: never adopted, PodNameTaken said at
  once and again only after a minute;
- a missing credentials Secret is waited for (the Waiting condition, status.reason and one
  Event say why; tries thin out) and fails the run after secretWaitSeconds; back in time, the
  attempt starts and Waiting turns False; an unreadable bucket manifest holds the start the same
  way;
- two Reconcilers in one process, each with its own metrics registry, and no thread started;
- pods of older attempts go away for sure: a DELETE refused once is sent again at the next
  pass; DELETEs refused every time never stop the next attempt's pod, and the pod is reported
  once it has been refused for its grace period plus the margin; a pod a finalizer holds is
  deleted with grace 0, reported once (OldPodLingers, the gauge at 1) and again only after ten
  minutes, and counted no more once it is gone; a graceful DELETE turns into grace 0 once the
  pod outlived its grace period; a pod with the run's labels that is another owner's is never
  deleted; a run that failed keeps deleting its last pod after a refused DELETE;
- the next attempt (and its fence) waits while the old pod's sidecar uploads the trainer's last
  save, up to the pod's grace period;
- no hot loop from a template that fakes the operator's signals (the notice annotation, an init
  container named like the restore exiting with the checkpoint-bad code) with a trainer that
  keeps failing: over 45 s the pods stay few and the run ends as a crash loop;
- the unprotected-run warning: the pass comes back at the deadline, reads the bucket manifest
  then even when the last refresh is recent (a commit since it protects, no warning), and warns
  once; ``status.latestCheckpoint.format`` is the format of the manifest entry (hf without one);
- the trainer's progress (``status.progress``): the sidecar's record read with a manifest
  refresh, at most once a minute, while an attempt runs; the status written for it no more
  often; a garbage record, one over the store's cap or an endpoint down changes nothing; the
  ETA goes when the attempt ends.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.builders import NAMESPACE, T0, PodBuilder, make_node, make_pod, make_run
from tests.unit.fakes import Clock, FakeBucket, FakeKube
from trainingrun.checkpoint.manifest import RUN_MANIFEST, Layout
from trainingrun.checkpoint.progress import PROGRESS_RECORD, ProgressRecord, encode
from trainingrun.contract import (
    ANNOTATION_NOTICE,
    ANNOTATION_RESUME_STEP,
    ANNOTATION_STOP,
    EXIT_CHECKPOINT_BAD,
    EXIT_STOPPED,
    LABEL_ATTEMPT,
    LABEL_RUN,
    RESTORE_CONTAINER,
    STOP_SUSPEND,
    TIME_FORMAT_MICRO,
    rfc3339,
)
from trainingrun.decide import reasons as R
from trainingrun.decide.naming import run_prefix
from trainingrun.decide.oldpods import Timing
from trainingrun.decide.waits import MIN_RETRY_SECONDS
from trainingrun.operator.buckets import RunStores
from trainingrun.operator.launch import Launcher
from trainingrun.operator.metrics import OperatorMetrics
from trainingrun.operator.reconciler import Reconciler
from trainingrun.operator.settings import OperatorSettings
from trainingrun.storage.opener import StorageUnavailable, TooLarge, parse_uri

RUN = "r1"


class Events:
    """The Event sink: what a pass hands over, in order."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, run: Any, type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.posted]


# The Kubernetes API's writes; during a pass only the applier makes them.
API_WRITES = (
    "patch_run_status",
    "annotate_pod",
    "delete_pod_by_uid",
    "create_pod",
    "create_service",
    "create_object",
    "replace_object_status",
    "delete_object",
)
APPLIER = "trainingrun.operator.applier"


def only_the_applier_writes(kube: Any, in_pass: Callable[[], bool]) -> None:
    """Wraps ``kube``'s writes: one called during a pass from a module of the product other
    than the applier fails the test (a test's own call, from a test module, is let through)."""
    for name in API_WRITES:
        write = getattr(kube, name, None)
        if write is None:  # a fake without it (a test's subclass may add it)
            continue

        def guarded(*args: Any, _write: Any = write, _name: str = name, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if in_pass() and caller.startswith("trainingrun.") and caller != APPLIER:
                raise AssertionError(f"{caller} called {_name} during a pass, not the applier")
            return _write(*args, **kwargs)

        setattr(kube, name, guarded)


class World:
    """A cluster and a bucket in memory, and a Reconciler over them (``restart()`` builds a new
    one over the same world: an operator restart, caches and memory lost)."""

    def __init__(
        self,
        secret: str | None = None,
        replicas: int = 1,
        settings: OperatorSettings | None = None,
        storage: dict[str, Any] | None = None,
        **policy: Any,
    ) -> None:
        self.clock = Clock()
        self.settings = settings or OperatorSettings()
        self.kube = FakeKube()
        self.in_pass = False
        only_the_applier_writes(self.kube, lambda: self.in_pass)
        self.bucket = FakeBucket()
        builder = make_run(RUN).with_restart_policy(**policy)
        if replicas > 1:
            builder = builder.with_replicas(replicas)
        if secret:
            builder = builder.with_storage(credentials_secret=secret)
        if storage:
            builder = builder.with_storage(**storage)
        self.builder = builder
        spec = builder.spec().model_dump(by_alias=True, exclude_none=True)
        meta = {"name": RUN, "namespace": NAMESPACE, "uid": builder.uid, "generation": 1}
        self.kube.add_run({"metadata": meta, "spec": spec})
        self.location = parse_uri(run_prefix(builder.ref()))
        self.restart()

    def restart(self) -> None:
        self.events = Events()
        self.kube.clock = self.clock
        self.registry = CollectorRegistry()
        metrics = OperatorMetrics(self.registry)
        self.reconciler = Reconciler(
            self.kube,
            RunStores(self.kube, 30.0, self.bucket.open, monotonic=self.clock.monotonic),
            self.events,
            metrics,
            self.settings,
            now=self.clock.now,
            monotonic=self.clock.monotonic,
        )
        metrics.count_lingering_with(self.reconciler.old_pods.lingering)

    def reconcile(self) -> float | None:
        self.in_pass = True
        try:
            return self.reconciler.reconcile(NAMESPACE, RUN)
        finally:
            self.in_pass = False

    def status(self) -> dict[str, Any]:
        return self.kube.status_of(NAMESPACE, RUN)

    def pod(self, name: str) -> dict[str, Any]:
        return self.kube.pods[(NAMESPACE, name)]

    def report(self, builder: Any) -> None:
        """The kubelet reports a pod's state; the watch event reaches the cache."""
        pod = builder.build()
        self.kube.set_pod(pod)
        key = (NAMESPACE, pod["metadata"]["name"])
        self.reconciler.view.pods.put(key, self.kube.pods[key])

    def set_spec(self, **fields: Any) -> None:
        """The user changes the run's spec; the watch event reaches the cache."""
        run = self.kube.runs[(NAMESPACE, RUN)]
        run["spec"].update(fields)
        run["metadata"]["generation"] += 1
        self.reconciler.view.runs.put((NAMESPACE, RUN), copy.deepcopy(run))

    def watch(self) -> None:
        """The pod watch catches up: every pod as the API server has it, the deleted ones gone."""
        pods = self.reconciler.view.pods
        for key in set(pods.keys()) - set(self.kube.pods):
            pods.gone(key, None)
        for key, pod in self.kube.pods.items():
            pods.put(key, pod)

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_fresh_start_creates_the_first_pod_once() -> None:
    w = World()

    assert w.reconcile() is None

    assert w.kube.creates == ["r1-1"]
    pod = w.pod("r1-1")
    assert RESTORE_CONTAINER not in [c["name"] for c in pod["spec"]["initContainers"]]
    status = w.status()
    assert (status["attempt"], status["activePod"], status["phase"]) == (1, "r1-1", "Running")
    assert condition(status, R.RUNNING)["reason"] == R.STARTED
    assert w.events.posted == [("Normal", R.STARTED, "attempt 1 (r1-1) starts from scratch")]

    w.reconcile()
    assert w.kube.creates == ["r1-1"]
    assert w.events.reasons() == [R.STARTED]


def test_failure_backs_off_then_resumes_from_the_newest_checkpoint() -> None:
    w = World()
    w.reconcile()
    w.bucket.commit(w.location, 10, 20)
    w.report(make_pod("r1-1").on_node().trainer_exited(1))
    w.kube.nodes["n1"] = {"metadata": {"name": "n1"}, "status": {"conditions": []}}

    again = w.reconcile()

    status = w.status()
    assert (status["attempt"], status["restarts"], status["preemptions"]) == (2, 1, 0)
    assert status["phase"] == "Backoff" and status.get("activePod") is None
    assert again == pytest.approx(10.0)  # the first failure's backoff
    assert w.kube.creates == ["r1-1"]
    assert w.events.reasons() == [R.STARTED, R.FAILED_ATTEMPT]
    assert w.events.posted[-1][0] == "Warning"

    w.clock.advance(10)
    assert w.reconcile() is None

    assert w.kube.creates == ["r1-1", "r1-2"]
    assert w.pod("r1-2")["metadata"]["annotations"][ANNOTATION_RESUME_STEP] == "20"
    assert (w.status()["activePod"], w.status()["resumeStep"]) == ("r1-2", 20)
    assert w.events.reasons()[-1] == R.RESUMED


def test_preemption_resubmits_in_the_same_pass_without_backoff() -> None:
    w = World()
    w.reconcile()
    w.bucket.commit(w.location, 30)
    w.report(
        make_pod("r1-1")
        .on_node()
        .phase("Failed")
        .condition("DisruptionTarget", reason="EvictionByEvictionAPI")
    )

    assert w.reconcile() is None

    assert w.kube.creates == ["r1-1", "r1-2"]
    status = w.status()
    assert (status["attempt"], status["restarts"], status["preemptions"]) == (2, 0, 1)
    assert (status["activePod"], status["resumeStep"]) == ("r1-2", 30)
    assert w.events.reasons() == [R.STARTED, R.PREEMPTED, R.RESUMED]
    assert w.events.posted[1][0] == "Normal"


def test_a_resubmission_reads_the_run_manifest_twice() -> None:
    """The pass reads the manifest to judge the ending; the fence starts from that read (its
    ETag) and reads once more to confirm the compare-and-swap: no third read of the object."""
    w = World()
    w.reconcile()
    w.bucket.commit(w.location, 30)
    w.report(make_pod("r1-1").on_node().phase("Failed").condition("DisruptionTarget"))
    w.bucket.gets.clear()

    w.reconcile()

    manifest = w.location.key(RUN_MANIFEST)
    assert w.kube.creates == ["r1-1", "r1-2"]
    assert [key for key in w.bucket.gets if key == manifest] == [manifest, manifest]


def status_writes(w: World) -> list[dict[str, Any]]:
    """From now on, every status the reconciler writes, in order."""
    written: list[dict[str, Any]] = []
    write = w.kube.patch_run_status

    def counted(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        written.append(copy.deepcopy(status))
        return write(namespace, name, status)

    w.kube.patch_run_status = counted  # type: ignore[method-assign]
    return written


def test_a_resubmission_due_at_once_writes_the_status_once() -> None:
    """The ending and the started attempt in one write, after the pod exists; the Events
    after it, in the order of what happened."""
    w = World()
    w.reconcile()
    w.bucket.commit(w.location, 30)
    w.report(make_pod("r1-1").on_node().phase("Failed").condition("DisruptionTarget"))
    written = status_writes(w)

    w.reconcile()

    assert len(written) == 1
    assert (written[0]["attempt"], written[0]["preemptions"]) == (2, 1)
    assert (written[0]["activePod"], written[0]["resumeStep"]) == ("r1-2", 30)
    assert w.kube.creates == ["r1-1", "r1-2"]
    assert w.events.reasons() == [R.STARTED, R.PREEMPTED, R.RESUMED]


def test_a_start_after_a_backoff_writes_the_ending_first_then_the_start() -> None:
    w = World()
    w.reconcile()
    w.report(make_pod("r1-1").on_node().trainer_exited(1))
    w.kube.nodes["n1"] = {"metadata": {"name": "n1"}, "status": {"conditions": []}}
    written = status_writes(w)

    w.reconcile()
    w.clock.advance(10)
    w.reconcile()

    assert [(s["attempt"], s["phase"], s.get("activePod")) for s in written] == [
        (2, "Backoff", None),
        (2, "Running", "r1-2"),
    ]


def test_a_resubmission_that_cannot_take_the_fence_records_the_ending_and_the_wait() -> None:
    w = World()
    w.reconcile()
    w.report(make_pod("r1-1").on_node().phase("Failed").condition("DisruptionTarget"))
    w.bucket.put(w.location.key(RUN_MANIFEST), b"{not json")

    assert w.reconcile() == MIN_RETRY_SECONDS

    status = w.status()
    assert (status["attempt"], status["preemptions"], status.get("activePod")) == (2, 1, None)
    assert status["reason"] == R.MANIFEST_UNREADABLE
    assert w.events.reasons() == [R.STARTED, R.PREEMPTED, R.MANIFEST_UNREADABLE]
    assert w.kube.creates == ["r1-1"]


def test_operator_stopped_between_the_create_and_the_one_write_makes_one_pod() -> None:
    """The pod of attempt 2 was created, the write that records it never landed: the status
    still says attempt 1. The next operator judges the ending again and adopts r1-2."""
    w = World()
    w.reconcile()
    w.report(make_pod("r1-1").on_node().phase("Failed").condition("DisruptionTarget"))
    w.kube.create_pod(make_pod("r1-2").owned_by(RUN, w.builder.uid).build())
    assert w.status()["attempt"] == 1

    w.restart()
    w.watch()
    w.reconcile()
    w.reconcile()

    status = w.status()
    assert (status["attempt"], status["activePod"], status["preemptions"]) == (2, "r1-2", 1)
    assert [k[1] for k in w.kube.pods] == ["r1-1", "r1-2"]
    assert "r1-3" not in w.kube.creates


@pytest.mark.parametrize("created", [False, True], ids=["before-create", "after-create"])
def test_operator_restart_between_the_two_steps_makes_one_pod(created: bool) -> None:
    """Step 1 (attempt 2 recorded, no pod) landed; the operator stopped before the create, or
    after it but before recording the pod. The next operator makes exactly one r1-2."""
    w = World()
    w.reconcile()
    w.kube.patch_run_status(NAMESPACE, RUN, {"attempt": 2, "activePod": None, "preemptions": 1})
    del w.kube.pods[(NAMESPACE, "r1-1")]
    if created:
        w.kube.create_pod(make_pod("r1-2").owned_by(RUN, w.builder.uid).build())

    w.restart()
    w.reconcile()
    w.reconcile()

    assert [k for k in w.kube.pods if k[1].startswith("r1-")] == [(NAMESPACE, "r1-2")]
    status = w.status()
    assert (status["attempt"], status["activePod"]) == (2, "r1-2")
    assert "r1-3" not in w.kube.creates


def test_a_pod_of_the_attempts_name_that_is_not_the_runs_is_never_adopted() -> None:
    w = World()
    w.kube.create_pod(make_pod("r1-1").owned_by("other", "uid-other").build())

    again = w.reconcile()

    assert again == OperatorSettings().name_taken_retry_seconds
    status = w.status()
    assert status.get("activePod") is None
    assert (status["phase"], status["reason"]) == ("Pending", R.POD_NAME_TAKEN)
    assert "owned by TrainingRun/other" in status["message"]
    assert condition(status, R.WAITING)["reason"] == R.POD_NAME_TAKEN
    assert w.events.reasons() == [R.POD_NAME_TAKEN]
    assert "owned by TrainingRun/other" in w.events.posted[0][2]

    w.clock.advance(30)
    w.reconcile()
    assert w.events.reasons() == [R.POD_NAME_TAKEN]  # not repeated within a minute
    w.clock.advance(31)
    w.reconcile()
    assert w.events.reasons() == [R.POD_NAME_TAKEN, R.POD_NAME_TAKEN]


def test_a_missing_secret_is_waited_for_with_its_reason_in_status_then_fails_the_run() -> None:
    w = World(secret="creds")

    assert w.reconcile() == MIN_RETRY_SECONDS

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Pending", R.MISSING_SECRET)
    assert "creds" in status["message"] and "retrying for up to 600 s" in status["message"]
    waiting = condition(status, R.WAITING)
    assert (waiting["status"], waiting["reason"]) == ("True", R.MISSING_SECRET)
    assert [(t, r) for t, r, _ in w.events.posted] == [("Warning", R.MISSING_SECRET)]

    # Still missing: tried less often as the wait grows, said once, no pod.
    w.clock.advance(200)
    assert w.reconcile() == 50.0
    w.clock.advance(399)
    assert w.reconcile() == 60.0
    assert w.events.reasons() == [R.MISSING_SECRET]
    assert w.status()["phase"] == "Pending"

    w.clock.advance(1)  # secretWaitSeconds (600 s) have passed
    assert w.reconcile() is None

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Failed", R.MISSING_SECRET)
    assert condition(status, R.FAILED)["reason"] == R.MISSING_SECRET
    assert w.events.reasons() == [R.MISSING_SECRET, R.MISSING_SECRET]
    assert w.kube.creates == []


def test_a_secret_back_within_the_wait_starts_the_attempt_and_ends_the_wait() -> None:
    w = World(secret="creds")
    w.reconcile()
    w.kube.secrets[(NAMESPACE, "creds")] = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "k"}

    w.clock.advance(4)
    w.reconcile()
    assert w.kube.creates == []  # its absence is trusted for 5 s
    w.clock.advance(2)
    w.reconcile()

    assert w.kube.creates == ["r1-1"]
    status = w.status()
    assert (status["phase"], status["reason"]) == ("Running", R.STARTED)
    waiting = condition(status, R.WAITING)
    assert (waiting["status"], waiting["reason"]) == ("False", R.WAIT_OVER)
    assert w.events.reasons() == [R.MISSING_SECRET, R.STARTED]


def test_a_secret_deleted_while_the_attempt_runs_holds_the_next_start() -> None:
    """The Secret read a moment ago is cached as present; the next attempt's pod would take its
    keys from it, so the start reads it afresh and waits."""
    w = World(secret="creds")
    w.kube.secrets[(NAMESPACE, "creds")] = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "k"}
    w.reconcile()
    del w.kube.secrets[(NAMESPACE, "creds")]
    w.report(
        make_pod("r1-1")
        .on_node()
        .phase("Failed")
        .condition("DisruptionTarget", reason="EvictionByEvictionAPI")
    )

    w.reconcile()

    assert w.kube.creates == ["r1-1"]
    status = w.status()
    assert (status["attempt"], status["preemptions"], status["reason"]) == (2, 1, R.MISSING_SECRET)
    assert condition(status, R.WAITING)["status"] == "True"


def test_an_unreadable_manifest_holds_the_start_with_its_reason_in_status() -> None:
    w = World()
    w.bucket.put(w.location.key(RUN_MANIFEST), b"{not json")

    assert w.reconcile() == MIN_RETRY_SECONDS
    w.clock.advance(10)
    w.reconcile()

    status = w.status()
    assert (status["phase"], status["reason"]) == ("Pending", R.MANIFEST_UNREADABLE)
    assert RUN_MANIFEST in status["message"]
    assert condition(status, R.WAITING)["status"] == "True"
    assert w.events.reasons() == [R.MANIFEST_UNREADABLE]  # once, not at every retry
    assert w.kube.creates == []

    w.bucket.objects.pop(w.location.key(RUN_MANIFEST))
    w.clock.advance(10)
    w.reconcile()

    assert w.kube.creates == ["r1-1"]
    assert condition(w.status(), R.WAITING)["status"] == "False"


def test_a_secret_that_exists_reaches_the_store_and_the_pod_starts() -> None:
    w = World(secret="creds")
    w.kube.secrets[(NAMESPACE, "creds")] = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "key",
    }

    w.reconcile()

    assert w.kube.creates == ["r1-1"]
    assert [c["AWS_ACCESS_KEY_ID"] for _, c in w.bucket.opened if c] == ["id"]


def test_two_reconcilers_in_one_process_start_no_thread() -> None:
    threads = threading.active_count()
    first, second = World(), World()

    first.reconcile()
    second.reconcile()

    assert threading.active_count() == threads
    assert first.kube.creates == second.kube.creates == ["r1-1"]


# -- pods of older attempts -------------------------------------------------------------------

TIMING = Timing()
NOT_READY = make_node("n1").not_ready().build()


def preempted_on_a_lost_node(w: World) -> None:
    """Attempt 1 runs on n1; n1 goes NotReady: the next pass ends attempt 1 (asks r1-1 to go,
    grace 0) and creates r1-2."""
    w.reconcile()
    w.report(make_pod("r1-1").running())
    w.kube.nodes["n1"] = NOT_READY


def lingers(w: World) -> list[str]:
    return [m for _, r, m in w.events.posted if r == R.OLD_POD_LINGERS]


def test_a_delete_refused_once_is_sent_again_at_the_next_pass() -> None:
    w = World()
    preempted_on_a_lost_node(w)
    w.kube.refuse_deletes["r1-1"] = 1

    again = w.reconcile()

    assert w.kube.creates == ["r1-1", "r1-2"]
    assert (NAMESPACE, "r1-1") in w.kube.pods
    assert again == TIMING.retry_seconds
    assert w.metric("trainingrun_old_pod_deletes_total", result="failed") == 1

    w.clock.advance(again)
    w.reconcile()

    assert (NAMESPACE, "r1-1") not in w.kube.pods
    assert w.kube.deletes == [("r1-1", 0), ("r1-1", 0)]
    assert w.metric("trainingrun_old_pod_deletes_total", result="accepted") == 1
    w.watch()
    assert w.reconcile() is None
    assert w.kube.deletes == [("r1-1", 0), ("r1-1", 0)]
    assert lingers(w) == []


def test_deletes_refused_every_time_never_stop_the_next_attempt() -> None:
    w = World()
    preempted_on_a_lost_node(w)
    w.kube.refuse_deletes["r1-1"] = 1000

    w.reconcile()

    assert w.kube.creates == ["r1-1", "r1-2"]
    assert (w.status()["attempt"], w.status()["activePod"]) == (2, "r1-2")
    assert w.events.reasons() == [R.STARTED, R.PREEMPTED, R.STARTED]

    grace = w.pod("r1-1")["spec"]["terminationGracePeriodSeconds"]
    retries = int((grace + TIMING.margin_seconds) / TIMING.retry_seconds)
    for _ in range(retries):  # retried at every pass, past the pod's grace and the margin
        w.clock.advance(TIMING.retry_seconds)
        w.reconcile()

    assert len(w.kube.deletes) == 1 + retries
    assert w.metric("trainingrun_old_pod_deletes_total", result="failed") == 1 + retries
    assert len(lingers(w)) == 1
    assert "refused its DELETE (503" in lingers(w)[0]
    assert w.metric("trainingrun_old_pods_lingering") == 1
    assert w.kube.creates == ["r1-1", "r1-2"]


def test_a_pod_a_finalizer_holds_is_reported_once_and_counted_until_gone() -> None:
    w = World()
    preempted_on_a_lost_node(w)
    w.kube.hold(NAMESPACE, "r1-1", "example.com/keep")

    w.reconcile()
    w.watch()

    assert w.kube.deletes == [("r1-1", 0)]
    assert w.pod("r1-1")["metadata"]["deletionTimestamp"] == rfc3339(w.clock.now())
    assert lingers(w) == [] and w.metric("trainingrun_old_pods_lingering") == 0

    w.clock.advance(TIMING.margin_seconds)
    assert w.reconcile() == TIMING.retry_seconds

    [message] = lingers(w)
    assert message.startswith("pod r1-1 of attempt 1 is still there 30s after it was asked")
    assert "finalizers example.com/keep" in message
    assert w.events.posted[-1][0] == "Warning"
    assert w.metric("trainingrun_old_pods_lingering") == 1

    for _ in range(12):  # a minute: the DELETE is sent again, the Event is not
        w.clock.advance(TIMING.retry_seconds)
        w.reconcile()
    assert len(lingers(w)) == 1
    assert len(w.kube.deletes) == 3  # the first, the one with the report, one a minute later

    w.clock.advance(TIMING.report_seconds)
    w.reconcile()
    assert len(lingers(w)) == 2
    assert "still there 11m after" in lingers(w)[1]

    w.kube.release(NAMESPACE, "r1-1")
    w.watch()
    assert w.reconcile() is None
    assert w.metric("trainingrun_old_pods_lingering") == 0
    assert len(lingers(w)) == 2


def test_a_graceful_delete_turns_into_grace_0_once_the_pod_outlived_its_grace() -> None:
    """After an operator restart, the status says attempt 2 and r1-1 still runs on a Ready
    node: it is asked to go with its own grace period, then with grace 0."""
    w = World()
    w.reconcile()
    w.report(make_pod("r1-1").running())
    w.kube.nodes["n1"] = make_node("n1").build()
    w.kube.hold(NAMESPACE, "r1-1", "example.com/keep")
    w.kube.patch_run_status(NAMESPACE, RUN, {"attempt": 2, "activePod": None, "preemptions": 1})

    w.restart()
    w.watch()  # the watch lists every pod at start
    w.reconcile()
    w.watch()

    assert w.kube.creates == ["r1-1", "r1-2"]
    assert w.kube.deletes == [("r1-1", None)]
    grace = w.pod("r1-1")["spec"]["terminationGracePeriodSeconds"]
    assert w.pod("r1-1")["metadata"]["deletionGracePeriodSeconds"] == grace

    w.clock.advance(grace + TIMING.margin_seconds - 1)
    w.reconcile()
    assert w.kube.deletes == [("r1-1", None)]

    w.clock.advance(1)
    w.reconcile()
    assert w.kube.deletes == [("r1-1", None), ("r1-1", 0)]
    assert lingers(w) == []


def test_a_pod_with_the_runs_labels_that_is_another_owners_is_never_deleted() -> None:
    w = World()
    preempted_on_a_lost_node(w)
    w.reconcile()
    stranger = make_pod("r1-1-copy").running().owned_by("other", "uid-other").build()
    stranger["metadata"]["labels"] = {LABEL_RUN: RUN, LABEL_ATTEMPT: "1"}
    w.kube.create_pod(stranger)
    w.watch()

    for _ in range(3):
        w.clock.advance(TIMING.retry_seconds)
        w.reconcile()

    assert [name for name, _ in w.kube.deletes] == ["r1-1"]
    assert (NAMESPACE, "r1-1-copy") in w.kube.pods


def test_a_run_that_failed_keeps_deleting_its_last_pod_after_a_refused_delete() -> None:
    w = World(max_preemptions=0)
    preempted_on_a_lost_node(w)
    w.kube.refuse_deletes["r1-1"] = 1

    again = w.reconcile()

    assert w.status()["phase"] == "Failed"
    assert (NAMESPACE, "r1-1") in w.kube.pods
    assert again == TIMING.retry_seconds

    w.clock.advance(cast(float, again))
    w.reconcile()
    assert (NAMESPACE, "r1-1") not in w.kube.pods
    assert w.kube.creates == ["r1-1"]


def _trainer_saved_on_notice_and_exited(w: World, finished: str) -> PodBuilder:
    """r1-1 after a preemption notice: the trainer saved and exited, its sidecar still uploads
    that save (the pod Running on a Ready node)."""
    w.kube.annotate_pod(NAMESPACE, "r1-1", {ANNOTATION_NOTICE: "rebalance recommendation"})
    pod = PodBuilder.of(w.pod("r1-1")).running().trainer_exited(EXIT_STOPPED, phase="Running")
    built = pod.build()
    built["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = finished
    return PodBuilder.of(built)


def test_the_next_attempt_waits_for_the_old_sidecars_last_commit() -> None:
    """The fence is taken only once the old pod's sidecar is done with the trainer's last
    save: a fenced sidecar could not commit it, and the save would be lost."""
    w = World()
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(_trainer_saved_on_notice_and_exited(w, rfc3339(w.clock.now())))

    again = w.reconcile()

    assert (w.status()["attempt"], w.status()["preemptions"]) == (2, 1)
    assert w.kube.creates == ["r1-1"], "no pod, and no fence, while the old sidecar uploads"
    assert again is not None and 0 < again <= Timing().retry_seconds
    w.bucket.commit(w.location, 40)  # the sidecar commits the notice's save, then stops
    w.report(PodBuilder.of(w.pod("r1-1")).phase("Failed"))

    assert w.reconcile() is None
    assert w.kube.creates == ["r1-1", "r1-2"]
    assert w.status()["resumeStep"] == 40


def test_a_sidecar_that_never_stops_holds_the_next_attempt_for_its_grace_period_only() -> None:
    w = World()
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(_trainer_saved_on_notice_and_exited(w, rfc3339(w.clock.now())))
    w.reconcile()
    grace = w.builder.spec().preemption.termination_grace_period_seconds

    w.clock.advance(grace - 1)
    w.reconcile()
    assert w.kube.creates == ["r1-1"]
    w.clock.advance(2)
    w.reconcile()
    assert w.kube.creates == ["r1-1", "r1-2"]


# -- no hot loop --------------------------------------------------------------------------------


def _fake_signal(template: dict[str, Any], fake: str) -> None:
    if fake == "notice-annotation":
        template["metadata"]["annotations"][ANNOTATION_NOTICE] = "faked"
    else:
        user = {"name": RESTORE_CONTAINER, "image": "busybox", "command": ["false"]}
        template["spec"].setdefault("initContainers", []).append(user)


def _end_as_the_kubelet_would(w: World, name: str, fake: str) -> None:
    """The trainer exits 1, or the user's init container named like the restore exits 3."""
    pod = make_pod(name).on_node("n1")
    if fake == "notice-annotation":
        w.report(pod.trainer_exited(1))
    else:
        w.report(pod.init_exited(RESTORE_CONTAINER, EXIT_CHECKPOINT_BAD))


@pytest.mark.parametrize("fake", ["notice-annotation", "init-container-named-like-the-restore"])
def test_a_template_faking_the_operators_signals_makes_no_hot_loop(fake: str) -> None:
    """Each pod ends as soon as it is created and the operator passes five times a second:
    the faked signal made every failure a preemption or a bad checkpoint with nothing to fall
    back from, resubmitted at once (attempt 224 after 45 s). Now they are failures: backoff,
    then a crash loop."""
    w = World()
    _fake_signal(w.kube.runs[(NAMESPACE, RUN)]["spec"]["template"], fake)
    w.kube.nodes["n1"] = make_node("n1").build()

    while w.clock.now() < T0 + timedelta(seconds=45):
        for (_, name), pod in list(w.kube.pods.items()):
            if pod["status"].get("phase") == "Pending":
                _end_as_the_kubelet_would(w, name, fake)
        w.reconcile()
        w.clock.advance(0.2)

    created = sorted(set(w.kube.creates))
    assert len(created) <= 5, f"{len(created)} pods in 45 s: {created[:3]}...{created[-3:]}"
    status = w.status()
    assert (status["phase"], status["reason"], status["preemptions"]) == (
        "Failed",
        R.CRASH_LOOP,
        0,
    )


# -- the unprotected-run warning ---------------------------------------------------------------


@pytest.mark.parametrize("committed", [False, True], ids=["nothing-committed", "just-committed"])
def test_the_bucket_is_read_again_before_warning_unprotected(committed: bool) -> None:
    """At the deadline the manifest is read even though the last refresh is recent, so a
    checkpoint committed since that refresh is not taken for none; the warning comes once."""
    w = World()
    limit = w.builder.spec().checkpoint.unprotected_after_seconds
    refresh = OperatorSettings().checkpoint_refresh_seconds
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    assert w.reconcile() == pytest.approx(limit)  # comes back at the deadline
    assert condition(w.status(), R.PROTECTED)["status"] == "Unknown"
    w.clock.advance(limit - refresh / 2)
    w.reconcile()  # the refresh reads the manifest: nothing yet
    if committed:
        at = w.clock.now() + timedelta(seconds=1)
        w.bucket.commit(w.location, 40, at=at.strftime(TIME_FORMAT_MICRO))

    w.clock.advance(refresh / 2)  # the deadline; the last read was refresh / 2 ago
    w.reconcile()
    w.clock.advance(60)
    w.reconcile()

    protected = condition(w.status(), R.PROTECTED)
    if committed:
        assert (protected["status"], protected["reason"]) == ("True", R.CHECKPOINT_COMMITTED)
        assert R.UNPROTECTED not in w.events.reasons()
    else:
        assert (protected["status"], protected["reason"]) == ("False", R.UNPROTECTED)
        assert w.events.reasons() == [R.STARTED, R.UNPROTECTED]
        assert w.events.posted[-1][0] == "Warning"


@pytest.mark.parametrize(
    ("layout", "expected"),
    [(None, "hf"), (Layout(format="lightning", resume="epoch=0-step=40.ckpt"), "lightning")],
    ids=["no-layout", "lightning"],
)
def test_the_recognised_format_is_in_the_status(layout: Layout | None, expected: str) -> None:
    w = World()
    w.bucket.commit(w.location, 40, layout=layout)

    w.reconcile()

    assert w.status()["latestCheckpoint"]["format"] == expected


def test_a_suspension_annotates_the_pod_then_deletes_it_once_ended_and_resumes_after() -> None:
    w = World()
    w.reconcile()
    w.kube.nodes["n1"] = make_node().build()
    w.report(make_pod("r1-1").on_node().running())
    w.set_spec(suspend=True)

    w.reconcile()

    annotations = w.pod("r1-1")["metadata"]["annotations"]
    assert annotations[ANNOTATION_STOP] == STOP_SUSPEND
    assert ANNOTATION_NOTICE in annotations
    assert w.status()["phase"] == "Suspending"
    w.bucket.commit(w.location, 17)  # the save at the next step end
    ended = make_pod("r1-1").on_node().trainer_exited(EXIT_STOPPED)
    w.report(ended.annotated(ANNOTATION_STOP, STOP_SUSPEND))

    w.reconcile()

    assert ("r1-1", None) in w.kube.deletes  # ended, and still removed
    assert (NAMESPACE, "r1-1") not in w.kube.pods
    status = w.status()
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Suspended", 2, 0)
    assert w.kube.creates == ["r1-1"]
    w.set_spec(suspend=False)

    w.reconcile()

    assert w.kube.creates == ["r1-1", "r1-2"]
    assert w.pod("r1-2")["metadata"]["annotations"][ANNOTATION_RESUME_STEP] == "17"
    assert w.events.reasons() == [
        R.STARTED,
        R.SUSPEND_REQUESTED,
        R.PAUSED,
        R.SUSPEND_LIFTED,
        R.RESUMED,
    ]


# -- one applier --------------------------------------------------------------------------------


def test_a_room_writing_past_the_applier_fails_the_pass() -> None:
    """Every World's pass holds its writes to the applier; a launcher given the API client
    itself (as before the applier) is caught at its first create."""
    w = World()
    r = w.reconciler
    r.starter.launcher = Launcher(w.kube, r.view, OperatorMetrics(CollectorRegistry()), w.settings)

    with pytest.raises(AssertionError, match=r"trainingrun\.operator\.launch called create_pod"):
        w.reconcile()


# -- progress ------------------------------------------------------------------------------------


def publish(w: World, step: int, attempt: int = 1, data: bytes | None = None) -> None:
    """Rank 0's sidecar publishes its trainer at ``step`` of 1000, at 1 step/s since step 0."""
    t = w.clock.now().timestamp()
    record = ProgressRecord(step, attempt, 0, t - step, t, total_steps=1000)
    w.bucket.put(w.location.key(PROGRESS_RECORD), data or encode(record))


def test_progress_is_read_with_a_refresh_at_most_once_a_minute() -> None:
    w = World()
    refresh = OperatorSettings().checkpoint_refresh_seconds
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    key = w.location.key(PROGRESS_RECORD)
    publish(w, 600)
    w.clock.advance(refresh)
    w.reconcile()
    progress = w.status()["progress"]
    assert (progress["step"], progress["summary"], progress["etaSeconds"]) == (600, "60%", 400)
    assert progress["eta"] == "6m25s"  # 400 s from the record, 15 s before the status write
    assert w.bucket.gets.count(key) == 1

    written = status_writes(w)
    publish(w, 630)
    for _ in range(3):  # refreshes every 15 s: the record is not read again within the minute
        w.clock.advance(refresh)
        w.reconcile()
    assert (w.bucket.gets.count(key), w.status()["progress"]["step"], written) == (1, 600, [])
    w.clock.advance(refresh)
    w.reconcile()
    assert (w.bucket.gets.count(key), w.status()["progress"]["step"]) == (2, 630)
    assert len(written) == 1

    publish(w, 0, data=b"\x00" * 100_000)  # garbage: the display stays as it was
    w.clock.advance(60)
    w.reconcile()
    assert (w.bucket.gets.count(key), w.status()["progress"]["step"]) == (3, 630)

    w.report(PodBuilder.of(w.pod("r1-1")).on_node().trainer_exited(1))  # fails: backoff
    w.reconcile()
    progress = w.status()["progress"]
    assert (w.status()["phase"], progress["step"], progress.get("eta")) == ("Backoff", 630, None)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(TooLarge("s3://b/progress.json", 100 << 20, 8 << 20), id="100-MiB-object"),
        pytest.param(StorageUnavailable("endpoint down"), id="endpoint-down"),
    ],
)
def test_an_unreadable_progress_record_changes_only_the_display(error: Exception) -> None:
    w = World()
    w.reconcile()
    w.kube.nodes["n1"] = make_node("n1").build()
    w.report(PodBuilder.of(w.pod("r1-1")).running(since=rfc3339(w.clock.now())))
    publish(w, 600)
    w.clock.advance(60)
    w.reconcile()
    before = w.status()
    key = w.location.key(PROGRESS_RECORD)
    get = w.bucket.get

    def refusing(k: str) -> bytes | None:
        if k == key:
            raise error
        return get(k)

    w.bucket.get = refusing  # type: ignore[method-assign]
    w.clock.advance(60)
    w.reconcile()  # does not raise
    assert w.status() == before
    assert before["progress"]["step"] == 600
