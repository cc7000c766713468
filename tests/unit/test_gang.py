"""Gangs (spec.replicas > 1): the pods and Service one attempt is made of, how the attempt ends
from its pods' endings (rules G1-G5 of ``trainingrun.decide.gang``), and the Reconciler driving
a 4-pod gang against the in-memory fakes:

- a fresh start creates the headless Service and four pods, named by rank, with torchrun's
  environment; a second pass creates nothing;
- one member failing ends the attempt once: the three others are deleted, the next attempt has
  four new pods, restarts 1 and preemptions 0;
- a member being evicted (saving) keeps the attempt open while another member already failed;
  then the attempt is one preemption and spends no restart;
- a notice on one member's node reaches every member;
- a member not scheduled past the start timeout while the others run ends the attempt
  (GangNotScheduled in the condition and the Event), and its pods are deleted.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.unit.builders import T0, make_node, make_pod, make_run, pod_from
from tests.unit.test_reconciler import RUN, World, condition
from trainingrun import contract as c
from trainingrun.contract import rfc3339
from trainingrun.decide import reasons as R
from trainingrun.decide.classify import End, Outcome
from trainingrun.decide.gang import Member, gang_outcome
from trainingrun.decide.naming import gang_name_problem, member_names
from trainingrun.decide.pod import AgentSettings, build_pod, build_service

NAMESPACE = "ml"


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    return next(x for x in [*spec["containers"], *spec["initContainers"]] if x["name"] == name)


# -- the pods and the Service -------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 2])
def test_a_gang_pod_has_its_rank_dns_name_and_torchrun_environment(rank: int) -> None:
    ref = make_run("r1").with_replicas(3, master_port=23456).ref()

    pod = build_pod(ref, 4, None, AgentSettings(), epoch=7, rank=rank)

    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == f"r1-4-{rank}"
    assert meta["labels"][c.LABEL_RANK] == str(rank)
    assert (spec["hostname"], spec["subdomain"]) == (f"r1-4-{rank}", "r1")
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {c.LABEL_RUN: "r1", c.LABEL_ATTEMPT: "4"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    trainer = _env(_container(pod, c.TRAINER_CONTAINER))
    assert {k: trainer[k] for k in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR")} == {
        "PET_NNODES": "3",
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "r1-4-0.r1.ml.svc.cluster.local",
    }
    assert trainer["PET_MASTER_PORT"] == "23456"
    assert (trainer[c.ENV_RANK], trainer[c.ENV_REPLICAS]) == (str(rank), "3")
    sync = _env(_container(pod, c.SYNC_CONTAINER))
    assert (sync[c.ENV_RANK], sync[c.ENV_RANKS], sync[c.ENV_EPOCH]) == (str(rank), "3", "7")


def test_a_template_that_places_its_pods_itself_keeps_its_affinity() -> None:
    own = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    node = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    kept = make_run("r1").with_replicas(2).with_pod_spec(affinity=own).ref()
    merged = make_run("r1").with_replicas(2).with_pod_spec(affinity=node).ref()

    assert build_pod(kept, 1, None, AgentSettings(), 1)["spec"]["affinity"] == own
    affinity = build_pod(merged, 1, None, AgentSettings(), 1)["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in affinity["podAntiAffinity"]


@pytest.mark.parametrize("queued", [True, False])
def test_a_queued_gang_is_one_kueue_pod_group_per_attempt(queued: bool) -> None:
    builder = make_run("r1").with_replicas(3)
    if queued:
        builder = builder.with_template_label(c.LABEL_KUEUE_QUEUE, "team-a")

    pods = [build_pod(builder.ref(), 2, None, AgentSettings(), 1, rank) for rank in range(3)]

    groups = {p["metadata"]["labels"].get(c.LABEL_KUEUE_POD_GROUP) for p in pods}
    counts = {p["metadata"]["annotations"].get(c.ANNOTATION_KUEUE_GROUP_COUNT) for p in pods}
    assert (groups, counts) == (({"r1-2"}, {"3"}) if queued else ({None}, {None}))


def test_one_pod_per_attempt_looks_as_before() -> None:
    pod = build_pod(make_run("r1").ref(), 2, None, AgentSettings(), epoch=1)

    assert pod["metadata"]["name"] == "r1-2"
    assert c.LABEL_RANK not in pod["metadata"]["labels"]
    assert not {"hostname", "subdomain", "affinity"} & set(pod["spec"])
    names = set(_env(_container(pod, c.TRAINER_CONTAINER))) | set(
        _env(_container(pod, c.SYNC_CONTAINER))
    )
    assert not names & {"PET_NNODES", c.ENV_RANK, c.ENV_RANKS, c.ENV_REPLICAS}


def test_the_service_is_headless_owned_and_selects_the_runs_pods() -> None:
    ref = make_run("r1").with_replicas(2).ref()

    service = build_service(ref)

    assert service["metadata"]["name"] == "r1"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {c.LABEL_RUN: "r1"}
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["metadata"]["ownerReferences"][0]["uid"] == ref.uid
    assert member_names(ref, 5) == ["r1-5-0", "r1-5-1"]


@pytest.mark.parametrize(
    ("name", "attempt", "replicas", "problem"),
    [
        pytest.param("train", 1, 1, None, id="one-pod-any-name"),
        pytest.param("1train", 1, 1, None, id="one-pod-digit-first"),
        pytest.param("train", 1, 8, None, id="gang"),
        pytest.param("1train", 1, 2, "starts with a letter", id="gang-digit-first"),
        pytest.param("a.b", 1, 2, "DNS label", id="gang-dotted"),
        pytest.param("x" * 52, 1, 2, None, id="gang-longest-name-first-attempt"),
        pytest.param("x" * 52, 10**8, 2, "at most 63", id="gang-hostname-too-long-later"),
    ],
)
def test_gang_names_must_be_dns_labels(
    name: str, attempt: int, replicas: int, problem: str | None
) -> None:
    found = gang_name_problem(name, attempt, replicas)

    assert (found is None) == (problem is None)
    if problem is not None:
        assert found is not None and problem in found


# -- how the attempt ends (pure) ----------------------------------------------------------------

RUNNING = Outcome(End.NOT_ENDED, "Running", "")
SAVING = Outcome(End.NOT_ENDED, R.TERMINATING, "Evicted: saving and stopping")
DONE = Outcome(End.SUCCEEDED, R.SUCCEEDED, "the trainer exited 0")
FAILED = Outcome(End.FAILED, R.TRAINER_ERROR, "the trainer exited 1")
LOST = Outcome(End.PREEMPTED, R.NODE_NOT_READY, "the pod's node is not ready")
BAD = Outcome(End.CHECKPOINT_BAD, R.CHECKPOINT_BAD, "corrupt")
PULLING = Outcome(End.NOT_ENDED, R.IMAGE_PULL_RETRYING, "pull", decide_at=T0 + timedelta(60))


def _members(n: int, unscheduled: tuple[int, ...] = (), created: str = "") -> list[Member]:
    out = []
    for rank in range(n):
        pod = make_pod(f"r1-1-{rank}").created(created or rfc3339(T0)).build()
        if rank not in unscheduled:
            pod["spec"]["nodeName"] = f"n{rank}"
        out.append(Member(f"r1-1-{rank}", pod))
    return out


@pytest.mark.parametrize(
    ("outcomes", "end", "reason", "names"),
    [
        pytest.param([DONE], End.SUCCEEDED, R.SUCCEEDED, "", id="one-pod-its-own"),
        pytest.param([DONE, DONE, DONE], End.SUCCEEDED, R.SUCCEEDED, "", id="G1-all-succeeded"),
        pytest.param([DONE, RUNNING], End.NOT_ENDED, "Running", "", id="G1-first-waits"),
        pytest.param([FAILED, SAVING], End.NOT_ENDED, R.TERMINATING, "r1-1-1", id="G2-saving"),
        pytest.param([RUNNING, FAILED], End.FAILED, R.TRAINER_ERROR, "r1-1-1", id="G3-failed"),
        pytest.param([FAILED, LOST], End.PREEMPTED, R.NODE_NOT_READY, "r1-1-1", id="G3-lost"),
        pytest.param([BAD, FAILED], End.CHECKPOINT_BAD, R.CHECKPOINT_BAD, "r1-1-0", id="G3-bad"),
        pytest.param([DONE, FAILED], End.FAILED, R.TRAINER_ERROR, "r1-1-1", id="G3-done-fail"),
        pytest.param([RUNNING, PULLING], End.NOT_ENDED, R.IMAGE_PULL_RETRYING, "r1-1-1", id="G5"),
    ],
)
def test_the_attempt_ends_once_by_the_gravest_member_ending(
    outcomes: list[Outcome], end: End, reason: str, names: str
) -> None:
    members = _members(len(outcomes))

    got = gang_outcome(members, outcomes, start_timeout=600, now=T0)

    assert (got.end, got.reason) == (end, reason)
    assert names in got.message


@pytest.mark.parametrize(
    ("unscheduled", "after", "end", "reason"),
    [
        pytest.param((1,), 599, End.NOT_ENDED, R.GANG_SCHEDULING, id="G4-within-timeout"),
        pytest.param((1,), 600, End.FAILED, R.GANG_NOT_SCHEDULED, id="G4-past-timeout"),
        pytest.param((0, 1), 6000, End.NOT_ENDED, "Running", id="G4-none-scheduled-queued"),
    ],
)
def test_a_partial_gang_is_not_left_running_past_the_start_timeout(
    unscheduled: tuple[int, ...], after: int, end: End, reason: str
) -> None:
    members = _members(2, unscheduled)

    got = gang_outcome(
        members, [RUNNING, RUNNING], start_timeout=600, now=T0 + timedelta(seconds=after)
    )

    assert (got.end, got.reason) == (end, reason)
    if reason == R.GANG_SCHEDULING:
        assert got.decide_at == T0 + timedelta(seconds=600)
    if end is End.FAILED:
        assert "r1-1-1 not scheduled 600s" in got.message


# -- the Reconciler over a 4-pod gang ------------------------------------------------------------

NODES = ("n0", "n1", "n2", "n3")


def _gang_world(**policy: Any) -> World:
    w = World(replicas=4, **policy)
    for node in NODES:
        w.kube.nodes[node] = make_node(node).build()
    return w


def _run_all(w: World, attempt: int) -> None:
    for rank, node in enumerate(NODES):
        w.report(pod_from(w.pod(f"{RUN}-{attempt}-{rank}")).on_node(node).running())


def test_a_fresh_gang_gets_its_service_and_four_pods_once() -> None:
    w = _gang_world()

    w.reconcile()
    w.reconcile()

    assert w.kube.creates == [f"{RUN}-1-{rank}" for rank in range(4)]
    assert list(w.kube.services) == [(NAMESPACE, RUN)]
    status = w.status()
    assert (status["attempt"], status["activePod"]) == (1, f"{RUN}-1-0")
    assert condition(status, R.RUNNING)["message"] == "attempt 1 (4 pods) starts from scratch"


def test_one_member_failing_ends_the_attempt_and_the_next_has_four_new_pods() -> None:
    w = _gang_world(backoff={"initial_seconds": 0})
    w.reconcile()
    _run_all(w, 1)
    w.reconcile()

    w.report(pod_from(w.pod(f"{RUN}-1-2")).on_node("n2").trainer_exited(1))
    w.reconcile()

    status = w.status()
    assert (status["attempt"], status["restarts"], status["preemptions"]) == (2, 1, 0)
    deleted = sorted(name for name, _ in w.kube.deletes)
    assert deleted == [f"{RUN}-1-0", f"{RUN}-1-1", f"{RUN}-1-3"]  # 1-2 ended: kept for its logs
    assert w.kube.creates[4:] == [f"{RUN}-2-{rank}" for rank in range(4)]
    ended = [m for _, reason, m in w.events.posted if reason == R.FAILED_ATTEMPT]
    assert ended == ["attempt 1 (4 pods): Error: r1-1-2: the trainer exited 1"]


def test_an_evicted_member_saving_keeps_the_attempt_open_then_it_is_one_preemption() -> None:
    w = _gang_world()
    w.reconcile()
    _run_all(w, 1)
    w.reconcile()
    evicted = pod_from(w.pod(f"{RUN}-1-1")).on_node("n1").running().disrupted("EvictionByAPI")
    w.report(evicted)
    # The others lost a rank of their collective: rank 0's launcher exits 1 meanwhile.
    w.report(pod_from(w.pod(f"{RUN}-1-0")).on_node("n0").trainer_exited(1))

    w.reconcile()

    assert w.status()["attempt"] == 1
    assert w.status()["reason"] != R.PREEMPTED

    w.report(evicted.trainer_exited(c.EXIT_STOPPED))
    w.reconcile()

    status = w.status()
    assert (status["attempt"], status["restarts"], status["preemptions"]) == (2, 0, 1)
    assert w.kube.creates[4:] == [f"{RUN}-2-{rank}" for rank in range(4)]


def test_a_notice_on_one_members_node_reaches_every_member() -> None:
    w = _gang_world()
    w.reconcile()
    _run_all(w, 1)
    w.kube.nodes["n3"] = make_node("n3").tainted("karpenter.sh/disrupted").build()
    w.reconciler.view.nodes.put("n3", w.kube.nodes["n3"])

    w.reconcile()

    for rank in range(4):
        annotations = w.pod(f"{RUN}-1-{rank}")["metadata"]["annotations"]
        assert annotations[c.ANNOTATION_NOTICE] == "karpenter.sh/disrupted", rank


def test_a_member_never_scheduled_ends_the_partial_gang_after_the_timeout() -> None:
    w = _gang_world(backoff={"initial_seconds": 30})
    w.reconcile()
    for rank, node in enumerate(NODES[:3]):
        w.report(pod_from(w.pod(f"{RUN}-1-{rank}")).on_node(node).running())
    unscheduled = pod_from(w.pod(f"{RUN}-1-3")).phase("Pending")
    w.report(
        unscheduled.condition(
            "PodScheduled", "False", reason="Unschedulable", message="0/4 nodes are available"
        )
    )

    again = w.reconcile()

    assert again is not None and 595 <= again <= 602
    assert w.status()["reason"] == R.GANG_SCHEDULING

    w.clock.advance(601)
    w.reconcile()

    status = w.status()
    assert (status["attempt"], status["restarts"]) == (2, 1)
    running = condition(status, R.RUNNING)
    assert running["reason"] == R.FAILED_ATTEMPT
    assert "GangNotScheduled: r1-1-3 not scheduled 600s" in running["message"]
    assert "0/4 nodes are available" in running["message"]
    assert [m for _, reason, m in w.events.posted if reason == R.FAILED_ATTEMPT] == [
        running["message"]
    ]
    assert sorted(name for name, _ in w.kube.deletes) == [f"{RUN}-1-{r}" for r in range(4)]
