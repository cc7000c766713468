"""What a tenant's pod template cannot reach through the pod the operator builds
(``decide.pod``, ``decide.agents``):

- a gang's ``PET_MASTER_ADDR`` is rank 0's fully qualified name
  ``<pod>.<service>.<namespace>.svc.<cluster domain>`` (the cluster domain from
  ``AgentSettings.cluster_domain``, ``cluster.local`` by default), never a short name the DNS
  search list could complete in another namespace;
- the restore and sync containers run as root only with ``DAC_OVERRIDE``, every other
  capability dropped and no privilege escalation, whatever the pod's or the trainer's
  securityContext says (a root trainer, or one whose user the template does not name); as a
  non-root user (the trainer's) never with gid 0.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.builders import make_run
from trainingrun import contract as c
from trainingrun.decide.naming import RunRef
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of

AGENTS = (c.RESTORE_CONTAINER, c.SYNC_CONTAINER)
AGENT_GID = 65532  # the agent image's USER (images/agent/Dockerfile)


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    return next(x for x in [*spec["initContainers"], *spec["containers"]] if x["name"] == name)


@pytest.mark.parametrize(
    ("namespace", "replicas", "domain", "addr"),
    [
        pytest.param("ml", 3, None, "r1-4-0.r1.ml.svc.cluster.local", id="default-domain"),
        pytest.param("team-b", 2, None, "r1-4-0.r1.team-b.svc.cluster.local", id="namespace"),
        pytest.param("ml", 2, "corp.example", "r1-4-0.r1.ml.svc.corp.example", id="own-domain"),
    ],
)
def test_a_gangs_master_address_is_rank_0s_fully_qualified_name(
    namespace: str, replicas: int, domain: str | None, addr: str
) -> None:
    builder = make_run("r1").with_replicas(replicas)
    builder.namespace = namespace
    ref = builder.ref()
    settings = AgentSettings() if domain is None else AgentSettings(cluster_domain=domain)

    for rank in range(replicas):
        pod = build_pod(ref, 4, None, settings, epoch=1, rank=rank)
        trainer = _container(pod, c.TRAINER_CONTAINER)
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env[c.ENV_PET_MASTER_ADDR] == addr


def _with_security(pod_level: dict[str, Any] | None, trainer: dict[str, Any] | None) -> RunRef:
    ref = make_run("r1").ref()
    template = copy.deepcopy(ref.spec.template)
    if pod_level is not None:
        template["spec"]["securityContext"] = pod_level
    if trainer is not None:
        for container in template["spec"]["containers"]:
            if container["name"] == c.TRAINER_CONTAINER:
                container["securityContext"] = trainer
    spec = ref.spec.model_copy(update={"template": template})
    return RunRef(name=ref.name, namespace=ref.namespace, uid=ref.uid, spec=spec)


def _effective(pod: dict[str, Any], name: str, key: str) -> Any:
    """The id a container runs with: its own securityContext's, else the pod's (else the
    image's: None here)."""
    own = _container(pod, name).get("securityContext") or {}
    if own.get(key) is not None:
        return own[key]
    return (pod["spec"].get("securityContext") or {}).get(key)


@pytest.mark.parametrize(
    ("pod_level", "trainer", "uid", "gid"),
    [
        pytest.param({"runAsUser": 0}, None, 0, None, id="a-root-pod"),
        pytest.param({"runAsUser": 0, "runAsGroup": 0}, None, 0, 0, id="a-root-pod-and-group"),
        pytest.param({"runAsUser": 0}, {"runAsUser": 0}, 0, None, id="a-root-pod-and-trainer"),
        pytest.param({"runAsGroup": 0}, None, 0, 0, id="a-root-group-pod"),
        pytest.param(
            {"runAsNonRoot": True, "runAsGroup": 0}, None, None, AGENT_GID, id="non-root-no-uid"
        ),
        pytest.param(
            {"runAsUser": 1000, "runAsGroup": 0}, None, 1000, AGENT_GID, id="a-pods-root-group"
        ),
        pytest.param(
            None, {"runAsUser": 1000, "runAsGroup": 0}, 1000, AGENT_GID, id="a-trainers-root-group"
        ),
        pytest.param(
            {"runAsUser": 1000, "runAsGroup": 0},
            {"runAsUser": 0},
            0,
            0,
            id="a-root-trainer-in-a-pod-with-a-root-group",
        ),
        pytest.param({"runAsUser": 0}, {"runAsUser": 1000}, 1000, None, id="a-non-root-trainer"),
        pytest.param(None, None, 0, None, id="nothing-said"),
    ],
)
def test_the_agents_are_root_only_with_one_capability(
    pod_level: dict[str, Any] | None, trainer: dict[str, Any] | None, uid: int | None, gid: int
) -> None:
    ref = _with_security(pod_level, trainer)
    pod = build_pod(ref, 2, resume_of(ref, 120), AgentSettings(), epoch=2)

    for name in AGENTS:
        assert _effective(pod, name, "runAsUser") == uid, name
        assert _effective(pod, name, "runAsGroup") == gid, name
        sc = _container(pod, name)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, name
        if uid == 0:
            assert sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}, name
        else:
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert _effective(pod, name, "runAsGroup") != 0, name
