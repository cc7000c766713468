"""The containers the operator adds to a pod (restore and sync sidecar), hardened: build_pod()
and the agents' metrics server.

Covers:

- ``spec.checkpoint.sizeLimit``: the checkpoint emptyDir gets it and the restore gets it as
  ``TRAININGRUN_SIZE_LIMIT``; without it, neither;
- both agents run with ``seccompProfile: RuntimeDefault``; their user mirrors the trainer's: a
  non-zero ``runAsUser`` of the trainer container (else of the pod) becomes theirs, with its
  ``runAsGroup`` and ``runAsNonRoot: true``; no uid under ``runAsNonRoot: true`` keeps the
  agent image's own user; a root trainer, or no uid at all, makes them root with
  ``DAC_OVERRIDE`` the only capability (they read what the trainer keeps private); the
  template is left as it was;
- the metrics bind address from ``AgentSettings.metrics``: loopback (127.0.0.1), the pod's IP by
  the downward API, or off (port 0); the agents' own default without the variable is loopback.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.builders import RunBuilder, make_run
from trainingrun.agent import restore, sync
from trainingrun.contract import (
    CHECKPOINT_VOLUME,
    ENV_METRICS_ADDRESS,
    ENV_METRICS_PORT,
    ENV_SIZE_LIMIT,
    ENV_SYNC_NICE,
    RESTORE_CONTAINER,
    SYNC_CONTAINER,
    TRAINER_CONTAINER,
)
from trainingrun.decide.naming import RunRef
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of

AGENTS = (RESTORE_CONTAINER, SYNC_CONTAINER)


def _pod(
    run: RunBuilder | RunRef, settings: AgentSettings | None = None, step: int | None = 120
) -> dict[str, Any]:
    ref = run if isinstance(run, RunRef) else run.ref()
    return build_pod(ref, 2, resume_of(ref, step), settings or AgentSettings(), epoch=2)


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    return next(c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] == name)


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def _volume(pod: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == CHECKPOINT_VOLUME]
    return volume


# -- sizeLimit --------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["50Gi", "1.5Ti", "200G"])
def test_size_limit_goes_to_the_volume_and_the_restore(limit: str) -> None:
    pod = _pod(make_run("r1").with_checkpoint_fields(size_limit=limit))

    assert _volume(pod) == {"name": CHECKPOINT_VOLUME, "emptyDir": {"sizeLimit": limit}}
    assert _env(_container(pod, RESTORE_CONTAINER))[ENV_SIZE_LIMIT] == {
        "name": ENV_SIZE_LIMIT,
        "value": limit,
    }
    assert ENV_SIZE_LIMIT not in _env(_container(pod, SYNC_CONTAINER))


def test_without_a_size_limit_the_volume_and_the_restore_have_none() -> None:
    pod = _pod(make_run("r1"))

    assert _volume(pod) == {"name": CHECKPOINT_VOLUME, "emptyDir": {}}
    assert ENV_SIZE_LIMIT not in _env(_container(pod, RESTORE_CONTAINER))


# -- security context -------------------------------------------------------------------------


def _with_security(pod_level: dict[str, Any] | None, trainer: dict[str, Any] | None) -> RunRef:
    """The default run, its template's pod and trainer securityContext as given."""
    ref = make_run("r1").ref()
    template = copy.deepcopy(ref.spec.template)
    if pod_level is not None:
        template["spec"]["securityContext"] = pod_level
    if trainer is not None:
        for container in template["spec"]["containers"]:
            if container["name"] == TRAINER_CONTAINER:
                container["securityContext"] = trainer
    spec = ref.spec.model_copy(update={"template": template})
    return RunRef(name=ref.name, namespace=ref.namespace, uid=ref.uid, spec=spec)


USER_KEYS = ("runAsUser", "runAsGroup", "runAsNonRoot")


@pytest.mark.parametrize(
    ("pod_level", "trainer", "user"),
    [
        pytest.param(
            None,
            {"runAsUser": 1000, "runAsGroup": 2000},
            {"runAsUser": 1000, "runAsGroup": 2000, "runAsNonRoot": True},
            id="the-trainers-uid-and-gid",
        ),
        pytest.param(
            {"runAsUser": 1000},
            None,
            {"runAsUser": 1000, "runAsNonRoot": True},
            id="the-pods-uid-without-a-gid",
        ),
        pytest.param(
            {"runAsUser": 1000, "runAsGroup": 3000},
            {"runAsUser": 1500},
            {"runAsUser": 1500, "runAsGroup": 3000, "runAsNonRoot": True},
            id="the-trainers-uid-beats-the-pods-and-the-pods-gid-fills-in",
        ),
        pytest.param(
            {"runAsUser": 1000, "runAsGroup": 3000},
            {"runAsUser": 0},
            {"runAsUser": 0, "runAsNonRoot": False},
            id="a-root-trainer-in-a-non-root-pod-makes-them-root",
        ),
        pytest.param(
            {"runAsUser": 0},
            None,
            {"runAsUser": 0, "runAsNonRoot": False},
            id="a-root-pod-makes-them-root",
        ),
        pytest.param(
            None,
            None,
            {"runAsUser": 0, "runAsNonRoot": False},
            id="no-security-context-makes-them-root",
        ),
        pytest.param(
            {"fsGroup": 1000},
            {"readOnlyRootFilesystem": True},
            {"runAsUser": 0, "runAsNonRoot": False},
            id="no-uid-makes-them-root",
        ),
        pytest.param(
            {"runAsNonRoot": True},
            None,
            {"runAsNonRoot": True},
            id="the-pods-run-as-non-root-without-a-uid",
        ),
        pytest.param(
            None,
            {"runAsGroup": 2000},
            {"runAsUser": 0, "runAsNonRoot": False},
            id="a-gid-without-a-uid-makes-them-root",
        ),
        pytest.param(
            None,
            {"runAsNonRoot": True},
            {"runAsNonRoot": True},
            id="the-trainers-run-as-non-root-without-a-uid",
        ),
        pytest.param(
            {"runAsNonRoot": True, "runAsGroup": 0},
            None,
            {"runAsNonRoot": True, "runAsGroup": 65532},
            id="non-root-without-a-uid-never-gets-gid-0",
        ),
    ],
)
def test_agents_mirror_the_trainers_user(
    pod_level: dict[str, Any] | None, trainer: dict[str, Any] | None, user: dict[str, Any]
) -> None:
    ref = _with_security(pod_level, trainer)
    before = copy.deepcopy(ref.spec.template)

    pod = _pod(ref)

    for name in AGENTS:
        sc = _container(pod, name)["securityContext"]
        assert {k: sc[k] for k in USER_KEYS if k in sc} == user, name
    assert ref.spec.template == before


@pytest.mark.parametrize("step", [None, 120], ids=["fresh-start", "resumed"])
def test_agents_run_with_the_runtime_default_seccomp_profile(step: int | None) -> None:
    pod = _pod(make_run("r1"), step=step)

    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ([RESTORE_CONTAINER] if step else []) + [SYNC_CONTAINER]
    for name in names:
        sc = _container(pod, name)["securityContext"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        # make_run's template names no user: the agents run as root with one capability
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}
    assert "securityContext" not in _container(pod, TRAINER_CONTAINER)


@pytest.mark.parametrize(
    ("pod_level", "capabilities"),
    [
        pytest.param({"runAsUser": 1000}, {"drop": ["ALL"]}, id="as-the-trainers-user-none"),
        pytest.param({"runAsNonRoot": True}, {"drop": ["ALL"]}, id="as-their-own-user-none"),
        pytest.param(
            {"runAsUser": 0}, {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}, id="as-root-one"
        ),
    ],
)
def test_agents_keep_a_capability_only_as_root(
    pod_level: dict[str, Any], capabilities: dict[str, Any]
) -> None:
    pod = _pod(_with_security(pod_level, None), step=120)

    for name in AGENTS:
        assert _container(pod, name)["securityContext"]["capabilities"] == capabilities, name


# -- metrics ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        pytest.param(
            "loopback",
            {ENV_METRICS_ADDRESS: {"name": ENV_METRICS_ADDRESS, "value": "127.0.0.1"}},
            id="loopback",
        ),
        pytest.param(
            "pod",
            {
                ENV_METRICS_ADDRESS: {
                    "name": ENV_METRICS_ADDRESS,
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                }
            },
            id="pod-ip-by-the-downward-api",
        ),
        pytest.param(
            "off", {ENV_METRICS_PORT: {"name": ENV_METRICS_PORT, "value": "0"}}, id="off-port-0"
        ),
    ],
)
def test_metrics_address_follows_the_agent_settings(
    mode: str, expected: dict[str, dict[str, Any]]
) -> None:
    pod = _pod(make_run("r1"), AgentSettings(metrics=mode))

    for name in AGENTS:
        env = _env(_container(pod, name))
        got = {k: env[k] for k in (ENV_METRICS_ADDRESS, ENV_METRICS_PORT) if k in env}
        assert got == expected, name


@pytest.fixture(params=["sync", "restore"])
def served_by_the_agent(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    run_agent: Callable[[str, dict[str, str]], int],
) -> Callable[[dict[str, str]], list[tuple[int, str]]]:
    """Runs each agent's command in turn with the settings given, its work left out; returns
    the (port, address) of each metrics server it started."""
    command: str = request.param

    def served(env: dict[str, str]) -> list[tuple[int, str]]:
        started: list[tuple[int, str]] = []

        def start_http_server(port: int, addr: str, registry: object) -> None:
            started.append((port, addr))

        monkeypatch.setattr("prometheus_client.start_http_server", start_http_server)
        monkeypatch.setattr(sync, "main", lambda store, settings, metrics, stop: 0)
        monkeypatch.setattr(restore, "main", lambda store, settings, metrics: 0)
        # A nice of 0 leaves this process's priority as it is.
        assert run_agent(command, {ENV_SYNC_NICE: "0", **env}) == 0
        return started

    return served


@pytest.mark.parametrize(
    ("env", "address", "port"),
    [
        pytest.param({}, "127.0.0.1", 9091, id="default-loopback"),
        pytest.param({ENV_METRICS_ADDRESS: "10.1.2.3"}, "10.1.2.3", 9091, id="pod-ip"),
        pytest.param({ENV_METRICS_PORT: "9200"}, "127.0.0.1", 9200, id="other-port"),
    ],
)
def test_the_agents_serve_metrics_on_loopback_unless_told(
    served_by_the_agent: Callable[[dict[str, str]], list[tuple[int, str]]],
    env: dict[str, str],
    address: str,
    port: int,
) -> None:
    assert served_by_the_agent(env) == [(port, address)]


def test_metrics_off_serves_nothing(
    served_by_the_agent: Callable[[dict[str, str]], list[tuple[int, str]]],
) -> None:
    assert served_by_the_agent({ENV_METRICS_PORT: "0"}) == []
