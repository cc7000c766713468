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
- a missing credentials Secret fails the run with MissingSecret in status, condition and Event;
- two Reconcilers in one process, each with its own metrics registry, and no thread started.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.unit.builders import NAMESPACE, make_pod, make_run
from tests.unit.fakes import Clock, FakeBucket, FakeKube
from trainingrun.contract import ANNOTATION_RESUME_STEP, RESTORE_CONTAINER
from trainingrun.decide import reasons as R
from trainingrun.decide.pod import run_prefix
from trainingrun.opmetrics import OperatorMetrics
from trainingrun.reconciler import Reconciler
from trainingrun.settings import OperatorSettings
from trainingrun.storage import parse_uri
from trainingrun.stores import RunStores

RUN = "r1"


class Events:
    """The Event sink: what a pass hands over, in order."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, run: Any, type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.posted]


class World:
    """A cluster and a bucket in memory, and a Reconciler over them (``restart()`` builds a new
    one over the same world: an operator restart, caches and memory lost)."""

    def __init__(self, secret: str | None = None, **policy: Any) -> None:
        self.clock = Clock()
        self.kube = FakeKube()
        self.bucket = FakeBucket()
        builder = make_run(RUN).with_restart_policy(**policy)
        if secret:
            builder = builder.with_storage(credentials_secret=secret)
        self.builder = builder
        spec = builder.spec().model_dump(by_alias=True, exclude_none=True)
        meta = {"name": RUN, "namespace": NAMESPACE, "uid": builder.uid, "generation": 1}
        self.kube.add_run({"metadata": meta, "spec": spec})
        self.location = parse_uri(run_prefix(builder.ref()))
        self.restart()

    def restart(self) -> None:
        self.events = Events()
        self.reconciler = Reconciler(
            self.kube,
            RunStores(self.kube, 30.0, self.bucket.open, monotonic=self.clock.monotonic),
            self.events,
            OperatorMetrics(CollectorRegistry()),
            OperatorSettings(),
            now=self.clock.now,
            monotonic=self.clock.monotonic,
        )

    def reconcile(self) -> float | None:
        return self.reconciler.reconcile(NAMESPACE, RUN)

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
    assert w.status().get("activePod") is None
    assert w.events.reasons() == [R.POD_NAME_TAKEN]
    assert "owned by TrainingRun/other" in w.events.posted[0][2]

    w.clock.advance(30)
    w.reconcile()
    assert w.events.reasons() == [R.POD_NAME_TAKEN]  # not repeated within a minute
    w.clock.advance(31)
    w.reconcile()
    assert w.events.reasons() == [R.POD_NAME_TAKEN, R.POD_NAME_TAKEN]


def test_missing_secret_fails_with_one_reason_everywhere() -> None:
    w = World(secret="creds")

    assert w.reconcile() is None

    status = w.status()
    assert status["phase"] == "Failed"
    assert status["reason"] == R.MISSING_SECRET
    assert condition(status, R.FAILED)["reason"] == R.MISSING_SECRET
    assert [(t, r) for t, r, _ in w.events.posted] == [("Warning", R.MISSING_SECRET)]
    assert "creds" in status["message"]
    assert w.kube.creates == []


def test_a_secret_that_exists_reaches_the_store_and_the_pod_starts() -> None:
    w = World(secret="creds")
    w.kube.secrets[(NAMESPACE, "creds")] = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "key",
    }

    w.reconcile()

    assert w.kube.creates == ["r1-1"]
    assert [c.access_key for _, c in w.bucket.opened if c] == ["id"]


def test_two_reconcilers_in_one_process_start_no_thread() -> None:
    threads = threading.active_count()
    first, second = World(), World()

    first.reconcile()
    second.reconcile()

    assert threading.active_count() == threads
    assert first.kube.creates == second.kube.creates == ["r1-1"]
