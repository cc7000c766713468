"""Kueue's admission is bound to the run and the pod template it was given for
(``decide.workload``, ``trainingrun.operator.queues``):

- a Workload of the run's name whose controller owner is not the run (a deleted run's of the
  same name, anyone else's) is never adopted: the run waits (``WorkloadFailed``, saying why),
  the Workload is left as it is (no status write, no delete) and a new one is created once it
  is gone;
- each Workload carries the hash of the template fields Kueue admits by
  (``trainingrun.dev/admission-hash``: the containers' resources, the node placement, the
  replicas); a Workload whose hash is not the current template's (or that has none) does not
  admit a new attempt: the run is re-queued, the old Workload is marked Finished
  (``OutOfSync``) and deleted once the run has no pod left, and a new one is created for the
  current template. An attempt already running keeps the admission it was started under. A
  DELETE the API server refuses (no RBAC) holds the run with the reason and the fix;
- ``Kube.delete_object``: a DELETE with the Workload's UID as precondition; 404 and 409 are
  nothing deleted, 403 is ``Forbidden``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from tests.unit.builders import NAMESPACE, make_pod
from tests.unit.fakes import FakeKube, answer_json, loopback_api_client
from tests.unit.test_reconciler import RUN, World, condition
from trainingrun import api
from trainingrun.contract import TRAINER_CONTAINER
from trainingrun.decide import reasons as R
from trainingrun.decide import workload as W
from trainingrun.operator.kube import Forbidden, Kube
from trainingrun.operator.kubeconn import HttpError

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
UID = "u1"
TEMPLATE: dict[str, Any] = {
    "spec": {
        "containers": [
            {"name": "trainer", "image": "i", "resources": {"requests": {"cpu": "1"}}},
        ],
        "nodeSelector": {"pool": "cpu"},
    }
}


def _template(**changes: Any) -> dict[str, Any]:
    template = copy.deepcopy(TEMPLATE)
    template["spec"].update(changes)
    return template


def _gpus(n: int) -> dict[str, Any]:
    trainer = {"name": "trainer", "image": "i", "resources": {"limits": {"nvidia.com/gpu": n}}}
    return _template(containers=[trainer])


def _owned(uid: str | None) -> list[dict[str, Any]]:
    if uid is None:
        return []
    ref = {"apiVersion": "trainingrun.dev/v1alpha1", "kind": "TrainingRun", "name": "r1"}
    return [{**ref, "uid": uid, "controller": True}]


def _admitted(
    owner: str | None = UID, admission: str | None = None, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "trainingrun-r1", "ownerReferences": _owned(owner)}
    if admission is not None:
        meta["annotations"] = {W.ANNOTATION_ADMISSION: admission}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T11:59:00Z"
    conds = [
        {"type": "QuotaReserved", "status": "True"},
        {"type": "Admitted", "status": "True"},
    ]
    return {"metadata": meta, "status": {"conditions": conds, "admission": {"clusterQueue": "cq"}}}


HASH = W.admission_hash(TEMPLATE, 1)


@pytest.mark.parametrize(
    ("template", "replicas", "same"),
    [
        pytest.param(TEMPLATE, 1, True, id="unchanged"),
        pytest.param(_template(hostname="x"), 1, True, id="a-field-kueue-does-not-admit-by"),
        pytest.param(_gpus(8), 1, False, id="more-resources"),
        pytest.param(_template(nodeSelector={"pool": "gpu"}), 1, False, id="another-node-pool"),
        pytest.param(
            _template(tolerations=[{"key": "gpu", "operator": "Exists"}]),
            1,
            False,
            id="tolerations",
        ),
        pytest.param(TEMPLATE, 4, False, id="more-replicas"),
    ],
)
def test_the_admission_hash_changes_with_what_kueue_admits_by(
    template: dict[str, Any], replicas: int, same: bool
) -> None:
    assert (W.admission_hash(template, replicas) == HASH) is same


@pytest.mark.parametrize(
    ("workload", "running", "admitted", "reason", "words"),
    [
        pytest.param(_admitted(admission=HASH), False, True, R.ADMITTED_BY_KUEUE, "cq", id="own"),
        pytest.param(
            _admitted("uid-of-a-deleted-run", HASH),
            False,
            False,
            R.WORKLOAD_FAILED,
            "not this run's",
            id="another-runs",
        ),
        pytest.param(
            _admitted(None, HASH), False, False, R.WORKLOAD_FAILED, "not this run's", id="no-owner"
        ),
        pytest.param(
            _admitted("uid-of-a-deleted-run", HASH),
            True,
            False,
            R.WORKLOAD_FAILED,
            "not this run's",
            id="another-runs-while-running",
        ),
        pytest.param(
            _admitted(admission=W.admission_hash(_gpus(8), 1) + "x"),
            False,
            False,
            R.QUEUED,
            "template changed",
            id="a-template-edit-after-admission-is-re-queued",
        ),
        pytest.param(
            _admitted(), False, False, R.QUEUED, "template changed", id="no-hash-is-re-queued"
        ),
        pytest.param(
            _admitted(admission="other"),
            True,
            True,
            R.ADMITTED_BY_KUEUE,
            "cq",
            id="a-running-attempt-keeps-its-admission",
        ),
        pytest.param(
            _admitted(admission=HASH, deleting=True),
            False,
            False,
            R.QUEUED,
            "being deleted",
            id="being-deleted",
        ),
    ],
)
def test_an_admission_counts_only_for_its_run_and_template(
    workload: dict[str, Any], running: bool, admitted: bool, reason: str, words: str
) -> None:
    q = W.answer(workload, "q", UID, HASH, running=running)

    assert (q.admitted, q.reason) == (admitted, reason)
    assert words in q.message


def test_a_replaced_workload_is_finished_out_of_sync_once() -> None:
    old = _admitted(admission="other")

    status = W.replaced(old, NOW)

    assert status is not None
    done = next(c for c in status["conditions"] if c["type"] == "Finished")
    assert (done["status"], done["reason"]) == ("True", "OutOfSync")
    assert W.replaced({**old, "status": status}, NOW) is None


def test_the_workload_carries_its_admission_hash() -> None:
    run = {
        "apiVersion": "trainingrun.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "r1", "namespace": "ml", "uid": UID},
    }
    body = W.build_workload(run, {"spec": TEMPLATE["spec"]}, 1, None, admission=HASH)

    assert body["metadata"]["annotations"] == {W.ANNOTATION_ADMISSION: HASH}


# -- the reconciler against the fakes -----------------------------------------------------------


@dataclasses.dataclass
class KueueKube(FakeKube):
    """FakeKube with the DELETE of a custom object (by UID precondition), UIDs on the objects it
    creates, and a record of the Workloads marked Finished."""

    object_deletes: list[str] = dataclasses.field(default_factory=list)
    finished: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, reason)

    def replace_object_status(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None:
        super().replace_object_status(group, version, plural, body)
        for c in body["status"].get("conditions") or []:
            if c["type"] == "Finished" and c["status"] == "True":
                self.finished.append((body["metadata"]["name"], c["reason"]))

    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        created = super().create_object(group, version, plural, body)
        if created is not None:
            uid = f"wl-{self._rv()}"
            meta = body["metadata"]
            self.objects[(plural, meta["namespace"], meta["name"])]["metadata"]["uid"] = uid
            created["metadata"]["uid"] = uid
        return created

    def delete_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str,
        uid: str | None = None,
    ) -> bool:
        self.object_deletes.append(name)
        found = self.objects.get((plural, namespace, name))
        if found is None or (uid and found["metadata"].get("uid") != uid):
            return False
        del self.objects[(plural, namespace, name)]
        return True


KEY = (W.WORKLOADS, NAMESPACE, W.workload_name(RUN))


def queued_world() -> World:
    """The World of test_reconciler, its run queued in LocalQueue q, Kueue installed."""
    w = World()
    fields = {f.name: getattr(w.kube, f.name) for f in dataclasses.fields(FakeKube)}
    kube = KueueKube(**fields)
    kube.served.add(W.WORKLOADS)
    run = kube.runs[(NAMESPACE, RUN)]
    run.update(apiVersion=f"{api.GROUP}/{api.VERSION}", kind=api.KIND)
    run["metadata"]["labels"] = {W.LABEL_QUEUE: "q"}
    w.kube = kube
    w.restart()
    return w


def admit(w: World) -> None:
    """Kueue admits the run's Workload."""
    workload = w.kube.objects[KEY]
    workload["status"] = {
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
        ],
        "admission": {"clusterQueue": "cq"},
    }


def trainer_resources(pod_spec: dict[str, Any]) -> dict[str, Any]:
    trainer = next(c for c in pod_spec["containers"] if c["name"] == TRAINER_CONTAINER)
    return dict(trainer.get("resources") or {})


def test_a_template_edit_after_admission_is_re_queued() -> None:
    w = queued_world()
    w.reconcile()
    assert KEY in w.kube.objects and w.kube.creates == []
    admit(w)
    w.reconcile()
    assert w.kube.creates == ["r1-1"]

    # The tenant asks for 8 GPUs; the running attempt goes on under its admission.
    template = copy.deepcopy(w.kube.runs[(NAMESPACE, RUN)]["spec"]["template"])
    trainer = next(c for c in template["spec"]["containers"] if c["name"] == TRAINER_CONTAINER)
    trainer["resources"] = {"limits": {"nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}
    w.set_spec(template=template)
    w.reconcile()
    assert condition(w.status(), R.ADMITTED)["status"] == "True"

    # The attempt ends: the next one is not started under the admission given for 1 CPU; the
    # old Workload, with no pod running under it, is finished (its quota back) and deleted.
    old = copy.deepcopy(w.kube.objects[KEY])
    w.report(
        make_pod("r1-1")
        .on_node()
        .phase("Failed")
        .condition("DisruptionTarget", reason="EvictionByEvictionAPI")
    )
    w.reconcile()
    assert w.kube.creates == ["r1-1"]
    admitted = condition(w.status(), R.ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("False", R.QUEUED)
    assert "template changed" in admitted["message"]
    assert w.kube.finished == [(W.workload_name(RUN), "OutOfSync")]
    assert KEY not in w.kube.objects
    assert w.kube.object_deletes == [W.workload_name(RUN)]
    # ... and a new one asks for what the next attempt will run.
    w.reconcile()
    new = w.kube.objects[KEY]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    (pod_set,) = new["spec"]["podSets"]
    assert trainer_resources(pod_set["template"]["spec"])["limits"] == {"nvidia.com/gpu": 8}
    assert w.kube.creates == ["r1-1"]

    admit(w)
    w.reconcile()
    assert w.kube.creates == ["r1-1", "r1-2"]
    assert trainer_resources(w.pod("r1-2")["spec"])["limits"] == {"nvidia.com/gpu": 8}


def test_a_workload_of_another_run_with_the_same_name_is_never_adopted() -> None:
    w = queued_world()
    w.kube.objects[KEY] = {
        "apiVersion": f"{W.KUEUE_GROUP}/{W.KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": W.workload_name(RUN),
            "namespace": NAMESPACE,
            "uid": "wl-old",
            "ownerReferences": _owned("uid-of-a-deleted-run"),
        },
        "spec": {"podSets": []},
        **{k: v for k, v in _admitted().items() if k == "status"},
    }
    before = copy.deepcopy(w.kube.objects[KEY])

    w.reconcile()

    assert w.kube.creates == []
    admitted = condition(w.status(), R.ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("False", R.WORKLOAD_FAILED)
    assert "not this run's" in admitted["message"]
    assert w.kube.objects[KEY] == before  # neither written nor deleted
    assert w.kube.object_deletes == []

    del w.kube.objects[KEY]  # the garbage collector removes the deleted run's Workload
    w.reconcile()
    owners = w.kube.objects[KEY]["metadata"]["ownerReferences"]
    assert [o["uid"] for o in owners] == [w.builder.uid]
    assert w.kube.creates == []


class RefusingKube(KueueKube):
    """An operator without ``delete`` on workloads (the chart's RBAC of an older release)."""

    def delete_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str,
        uid: str | None = None,
    ) -> bool:
        self.object_deletes.append(name)
        raise Forbidden("workloads.kueue.x-k8s.io is forbidden: cannot delete")


def test_a_refused_delete_of_a_replaced_workload_holds_the_run_and_says_why() -> None:
    w = queued_world()
    fields = {f.name: getattr(w.kube, f.name) for f in dataclasses.fields(KueueKube)}
    w.kube = RefusingKube(**fields)
    w.restart()
    w.reconcile()
    w.kube.objects[KEY]["metadata"]["annotations"] = {W.ANNOTATION_ADMISSION: "an-older-one"}
    admit(w)

    w.reconcile()
    w.reconcile()

    assert w.kube.creates == []
    admitted = condition(w.status(), R.ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("False", R.WORKLOAD_FAILED)
    assert "grant the operator delete on workloads" in admitted["message"]
    assert KEY in w.kube.objects and len(w.kube.object_deletes) == 2


class _DeleteAnswers(BaseHTTPRequestHandler):
    """Answers every DELETE with ``status``; records (path, body)."""

    status: ClassVar[int] = 200
    seen: ClassVar[list[tuple[str, Any]]] = []

    def do_DELETE(self) -> None:  # the http.server hook's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        code = type(self).status
        answer_json(self, code, {"kind": "Status", "code": code, "message": f"said {code}"})

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.mark.parametrize(
    ("status", "result"),
    [(200, True), (404, False), (409, False), (403, Forbidden), (500, HttpError)],
    ids=["accepted", "gone", "another-uid", "forbidden", "other"],
)
def test_the_workload_delete_carries_the_uid_precondition(
    status: int, result: bool | type[Exception]
) -> None:
    answers = type("Answers", (_DeleteAnswers,), {"status": status, "seen": []})
    with loopback_api_client(answers) as rest:
        k = Kube(rest)
        args = (W.KUEUE_GROUP, W.KUEUE_VERSION, W.WORKLOADS, "trainingrun-r1", "ml", "wl-1")
        if isinstance(result, bool):
            assert k.delete_object(*args) is result
        else:
            with pytest.raises(result):
                k.delete_object(*args)

    ((path, body),) = answers.seen
    assert path == "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/trainingrun-r1"
    assert body["preconditions"] == {"uid": "wl-1"}
