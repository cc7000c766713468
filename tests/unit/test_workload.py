"""decide.workload: the Workload of a queued run, what Kueue's answer means for the run, and the
status writes Kueue expects from the Workload's owner (quota given back after an eviction,
Finished when the run ended)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from trainingrun.decide import reasons as R
from trainingrun.decide import workload as W

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
RUN = {
    "apiVersion": "trainingrun.dev/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "r1", "namespace": "ml", "uid": "u1", "labels": {W.LABEL_QUEUE: "q"}},
}
POD = {
    "spec": {
        "containers": [{"name": "trainer", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [
            {"name": "trainingrun-sync", "image": "a", "restartPolicy": "Always", "env": []}
        ],
        "nodeSelector": {"pool": "gpu"},
    }
}


def cond(ctype: str, status: str, reason: str = "R", message: str = "m") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message}


def wl(*conds: dict[str, Any], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conds)}
    if admission is not None:
        status["admission"] = admission
    return {"metadata": {"name": "trainingrun-r1", "generation": 1}, "status": status}


def test_the_workload_is_owned_by_the_run_with_one_pod_set_per_attempt() -> None:
    body = W.build_workload(RUN, POD, 4, ("high", 1000))

    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["spec"]["queueName"] == "q"
    (pod_set,) = body["spec"]["podSets"]
    assert pod_set["count"] == 4
    spec = pod_set["template"]["spec"]
    assert spec["initContainers"] == [
        {"name": "trainingrun-sync", "image": "a", "restartPolicy": "Always"}
    ]
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert (body["spec"]["priorityClassName"], body["spec"]["priority"]) == ("high", 1000)
    assert "priority" not in W.build_workload(RUN, POD, 1, None)["spec"]


@pytest.mark.parametrize(
    ("workload", "installed", "admitted", "reason", "words"),
    [
        (None, False, False, R.KUEUE_NOT_INSTALLED, "not installed"),
        (None, True, False, R.QUEUED, "waiting"),
        (
            wl(cond("QuotaReserved", "False", "Pending", "insufficient quota")),
            True,
            False,
            R.QUEUED,
            "insufficient quota",
        ),
        (
            wl(cond("Admitted", "True"), admission={"clusterQueue": "cq"}),
            True,
            True,
            R.ADMITTED_BY_KUEUE,
            "cq",
        ),
        (
            wl(cond("Admitted", "True"), cond("Evicted", "True", "Preempted", "to admit x")),
            True,
            False,
            R.EVICTED,
            "Preempted",
        ),
        (wl(cond("Admitted", "True"), cond("Finished", "True")), True, False, R.QUEUED, "q"),
    ],
)
def test_kueues_answer_for_the_run(
    workload: dict[str, Any] | None, installed: bool, admitted: bool, reason: str, words: str
) -> None:
    q = W.queue_of(workload, "q", installed)

    assert (q.admitted, q.reason) == (admitted, reason)
    assert words in q.message


def test_an_evicted_workload_gives_its_quota_back_once() -> None:
    evicted = wl(
        cond("QuotaReserved", "True"),
        cond("Admitted", "True"),
        cond("Evicted", "True", "Preempted", "to admit x"),
        admission={"clusterQueue": "cq"},
    )

    status = W.released(evicted, NOW)

    assert status is not None and status["admission"] is None
    got = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert got["QuotaReserved"] == ("False", "Pending")
    assert got["Admitted"] == ("False", "NoReservation")
    assert got["Requeued"] == ("True", "Preempted")
    assert W.released({**evicted, "status": status}, NOW) is None
    assert W.released(wl(cond("QuotaReserved", "True")), NOW) is None  # not evicted


@pytest.mark.parametrize("succeeded", [True, False])
def test_a_finished_run_finishes_its_workload_once(succeeded: bool) -> None:
    status = W.finished(wl(cond("Admitted", "True")), succeeded, "done", NOW)

    assert status is not None
    done = next(c for c in status["conditions"] if c["type"] == "Finished")
    assert (done["status"], done["reason"]) == ("True", "Succeeded" if succeeded else "Failed")
    assert W.finished({"status": status}, succeeded, "done", NOW) is None
