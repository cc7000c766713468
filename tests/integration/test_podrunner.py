"""The local pod runner (tests/podrunner) against the real control plane, no mocks: pods bound to
its node run as local processes and their status reads like a kubelet's.

Covers: init container → native sidecar → main container order and statuses; env from
secretKeyRef, configMapKeyRef and fieldRef; a missing Secret waits as CreateContainerConfigError;
emptyDir shared inside a pod and private to it; each container's TMPDIR its own, removed with the
pod; downward API annotations refreshed after
``kubectl annotate``; exit codes, termination messages (file and FallbackToLogsOnError),
StartError; a failing init container fails the pod; eviction → SIGTERM, grace, SIGKILL, sidecar
last, pod gone; SIGKILL of a container → 137; the runner's own SIGTERM stops every process and
marks pods as a node shutdown does; node Ready=False on report, and NotReady (Unknown) when
heartbeats stop; a partition from the API server: no lease renewal or status write, a
force-deleted pod's processes keep running (a sidecar that exits restarts with the credentials
looked up before), and after the heal they are stopped, the missed status is written and the
node is Ready again.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests import localenv as localenv_mod
from tests.integration.support import node_ready, pid_alive, wait_for
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle, placement, start_runner
from tests.podrunner.node import LEASE_NAMESPACE, LEASE_RENEW_S

# A mount point no other test uses, so nothing leaks to or from the host's own folders.
SCRATCH = "/tr-podrunner-test/data"


def sh(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "local.invalid/none", "command": ["sh", "-c", script], **extra}


def make_pod(
    name: str,
    node: str,
    containers: list[dict[str, Any]],
    *,
    init: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    grace: int = 5,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            **placement(node),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "initContainers": init or [],
            "containers": containers,
            "volumes": volumes or [{"name": "data", "emptyDir": {}}],
        },
    }


def data_mount() -> list[dict[str, Any]]:
    return [{"name": "data", "mountPath": SCRATCH}]


def create(core: Any, namespace: str, pod: dict[str, Any]) -> None:
    core.create_namespaced_pod(namespace, pod)


def read(core: Any, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = core.api_client.sanitize_for_serialization(
        core.read_namespaced_pod(name, namespace)
    )
    return pod


def wait_phase(
    core: Any, namespace: str, name: str, phases: tuple[str, ...], timeout_s: float = 30
) -> dict[str, Any]:
    def in_phase() -> dict[str, Any] | None:
        pod = read(core, namespace, name)
        return pod if pod["status"].get("phase") in phases else None

    return wait_for(in_phase, timeout_s, f"pod {name} in {phases}")


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    status = pod["status"]
    return {
        s["name"]: s
        for s in (status.get("initContainerStatuses") or [])
        + (status.get("containerStatuses") or [])
    }


def terminated(pod: dict[str, Any], container: str) -> dict[str, Any]:
    state: dict[str, Any] = statuses(pod)[container]["state"]
    assert "terminated" in state, f"{container} not terminated: {state}"
    return dict(state["terminated"])


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in obj["status"].get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    raise AssertionError(f"no {kind} condition in {obj['status'].get('conditions')}")


def final_object_after(
    core: Any, namespace: str, name: str, action: Any, timeout_s: float
) -> dict[str, Any]:
    """Runs ``action`` and returns the pod as it was when deleted (the DELETED event's object)."""
    version = core.read_namespaced_pod(name, namespace).metadata.resource_version
    action()
    stream = watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={name}",
        resource_version=version,
        timeout_seconds=int(timeout_s),
    )
    for event in stream:
        if event["type"] == "DELETED":
            raw: dict[str, Any] = event["raw_object"]
            return raw
    raise AssertionError(f"pod {name} not deleted within {timeout_s}s")


# ---------------------------------------------------------------------------------------------


def test_init_then_sidecar_then_main_with_kubelet_statuses(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    init = sh("prepare", f"echo prepared > {SCRATCH}/init.txt", volumeMounts=data_mount())
    sidecar = sh(
        "helper",
        f"trap 'echo stopped-after-main:$(cat {SCRATCH}/main.txt); exit 0' TERM;"
        f" echo up > {SCRATCH}/sidecar.txt; while true; do sleep 0.2; done",
        restartPolicy="Always",
        volumeMounts=data_mount(),
    )
    main = sh(
        "main",
        # A sidecar without a startup probe counts as started once its process runs, as with
        # the kubelet: wait (bounded) for its first write before reading it.
        f"for i in $(seq 100); do [ -e {SCRATCH}/sidecar.txt ] && break; sleep 0.1; done;"
        f" cat {SCRATCH}/init.txt {SCRATCH}/sidecar.txt > /dev/termination-log;"
        f" while [ ! -e {SCRATCH}/go ]; do sleep 0.1; done; echo finished > {SCRATCH}/main.txt",
        volumeMounts=data_mount(),
    )
    create(core_v1, namespace, make_pod("order", runner.node, [main], init=[init, sidecar]))

    running = wait_phase(core_v1, namespace, "order", ("Running",))
    wait_for(
        lambda: condition(read(core_v1, namespace, "order"), "Ready")["status"] == "True",
        15,
        "Ready=True while running",
    )
    running = read(core_v1, namespace, "order")
    by_name = statuses(running)
    assert terminated(running, "prepare")["exitCode"] == 0
    assert by_name["prepare"]["ready"] is True
    assert "running" in by_name["helper"]["state"] and by_name["helper"]["started"] is True
    assert "running" in by_name["main"]["state"] and by_name["main"]["ready"] is True
    for kind in ("PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady"):
        assert condition(running, kind)["status"] == "True", kind
    assert running["status"]["podIP"] == "127.0.0.1"
    assert running["status"]["startTime"]

    (runner.pod_dir(namespace, "order") / "volumes" / "data" / "go").write_text("")
    done = wait_phase(core_v1, namespace, "order", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded"
    main_end = terminated(done, "main")
    assert (main_end["exitCode"], main_end["reason"]) == (0, "Completed")
    assert main_end["message"] == "prepared\nup\n"
    helper_end = terminated(done, "helper")
    assert helper_end["exitCode"] == 0
    assert helper_end["finishedAt"] >= main_end["finishedAt"]
    assert "stopped-after-main:finished" in runner.log_of(namespace, "order", "helper")
    assert condition(done, "Ready")["reason"] == "PodCompleted"


def test_env_from_secret_configmap_and_field_refs(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    secret_value = f"s3cr3t-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="creds"), string_data={"KEY": secret_value}
        ),
    )
    core_v1.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"mode": "fast"}),
    )
    env = [
        {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "KEY"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "OWNER",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['example.com/owner']"}},
        },
        {"name": "JOINED", "value": "$(POD)@$(NODE)"},
    ]
    script = (
        'printf "%s|%s|%s|%s|%s|%s|%s|%s" "$SECRET" "$MODE" "$POD" "$NS" "$NODE" "$IP" "$OWNER"'
        ' "$JOINED" > /dev/termination-log'
    )
    pod = make_pod(
        "envs", runner.node, [sh("main", script, env=env)], annotations={"example.com/owner": "ana"}
    )
    create(core_v1, namespace, pod)
    done = wait_phase(core_v1, namespace, "envs", ("Succeeded", "Failed"))
    n = runner.node
    expected = f"{secret_value}|fast|envs|{namespace}|{n}|127.0.0.1|ana|envs@{n}"
    assert terminated(done, "main")["message"] == expected
    assert secret_value not in runner.runner_log()


def test_missing_secret_waits_then_runs_once_created(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    env = [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "later", "key": "K"}}}]
    create(core_v1, namespace, make_pod("waits", runner.node, [sh("main", "exit 0", env=env)]))

    def waiting_reason() -> str | None:
        state = statuses(read(core_v1, namespace, "waits")).get("main", {}).get("state", {})
        reason = state.get("waiting", {}).get("reason")
        return str(reason) if reason else None

    wait_for(lambda: waiting_reason() == "CreateContainerConfigError", 15, "config error")
    waiting = statuses(read(core_v1, namespace, "waits"))["main"]["state"]["waiting"]
    assert "later" in waiting["message"]
    assert read(core_v1, namespace, "waits")["status"]["phase"] == "Pending"
    core_v1.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="later"), string_data={"K": "v"}),
    )
    assert wait_phase(core_v1, namespace, "waits", ("Succeeded",))["status"]["phase"] == "Succeeded"


def test_empty_dir_is_shared_inside_a_pod_and_private_to_it(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    for name in ("left", "right"):
        writer = sh("writer", f"echo {name} > {SCRATCH}/who", volumeMounts=data_mount())
        reader = sh(
            "reader",
            f"for i in $(seq 100); do [ -e {SCRATCH}/who ] && break; sleep 0.1; done;"
            f" cat {SCRATCH}/who > /dev/termination-log",
            volumeMounts=data_mount(),
        )
        create(core_v1, namespace, make_pod(name, runner.node, [writer, reader]))
    for name in ("left", "right"):
        done = wait_phase(core_v1, namespace, name, ("Succeeded", "Failed"))
        assert terminated(done, "reader")["message"] == f"{name}\n"
    assert not Path(SCRATCH, "who").exists(), "a pod's emptyDir leaked to the host"


def test_each_container_has_temporary_files_of_its_own_gone_with_the_pod(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    # As a container's own /tmp: a trainer's temporary files (torch's among them) neither meet
    # another container's nor outlive the pod.
    script = 'd="${TMPDIR:?unset}"; echo mine > "$d/f"; ls "$d" > /dev/termination-log; echo "$d"'
    create(core_v1, namespace, make_pod("temps", runner.node, [sh("a", script), sh("b", script)]))
    done = wait_phase(core_v1, namespace, "temps", ("Succeeded", "Failed"))
    dirs = {c: Path(runner.log_of(namespace, "temps", c).strip()) for c in ("a", "b")}
    assert {c: terminated(done, c)["message"] for c in dirs} == {"a": "f\n", "b": "f\n"}
    assert dirs["a"] != dirs["b"]
    assert all(d.is_relative_to(runner.pod_dir(namespace, "temps")) for d in dirs.values())
    assert all((d / "f").read_text() == "mine\n" for d in dirs.values())

    core_v1.delete_namespaced_pod("temps", namespace, grace_period_seconds=0)
    wait_for(lambda: not any(d.exists() for d in dirs.values()), 30, "the temporary files gone")


def test_downward_api_annotations_follow_kubectl_annotate(
    runner: RunnerHandle, core_v1: Any, namespace: str, localenv: LocalEnv
) -> None:
    volumes = [
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                ]
            },
        }
    ]
    mounts = [{"name": "podinfo", "mountPath": "/etc/tr-podrunner-test/podinfo", "readOnly": True}]
    script = (
        "f=/etc/tr-podrunner-test/podinfo/annotations; t=/dev/termination-log;"
        " cat $f > $t; echo >> $t;"
        " while ! grep -q 'example.com/notice=\"now\"' $f; do sleep 0.1; done; cat $f >> $t"
    )
    pod = make_pod(
        "annotated",
        runner.node,
        [sh("main", script, volumeMounts=mounts)],
        volumes=volumes,
        annotations={"example.com/first": 'say "hi"'},
    )
    create(core_v1, namespace, pod)
    wait_phase(core_v1, namespace, "annotated", ("Running",))
    time.sleep(0.5)
    annotated_at = time.monotonic()
    localenv.kubectl("-n", namespace, "annotate", "pod", "annotated", "example.com/notice=now")
    done = wait_phase(core_v1, namespace, "annotated", ("Succeeded", "Failed"), timeout_s=15)
    assert time.monotonic() - annotated_at < 5, "annotation file not refreshed within seconds"
    before, after = terminated(done, "main")["message"].split("\n", 1)
    assert before == 'example.com/first="say \\"hi\\""'
    assert after.splitlines() == ['example.com/first="say \\"hi\\""', 'example.com/notice="now"']


def test_exit_codes_and_termination_messages(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    containers = [
        sh(
            "ok",
            "echo all good > /tmp-tr-msg/out; exit 0",
            terminationMessagePath="/tmp-tr-msg/out",
        ),
        sh(
            "fails",
            "echo first line; echo boom >&2; exit 3",
            terminationMessagePolicy="FallbackToLogsOnError",
        ),
        sh("quiet", "echo not in the message; exit 4"),
        sh(
            "written",
            "echo chosen > /dev/termination-log; echo log; exit 5",
            terminationMessagePolicy="FallbackToLogsOnError",
        ),
        {"name": "missing", "image": "x", "command": ["no-such-binary-tr"]},
    ]
    create(core_v1, namespace, make_pod("codes", runner.node, containers))
    done = wait_phase(core_v1, namespace, "codes", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Failed"
    ok, fails, quiet, written, missing = (
        terminated(done, n) for n in ("ok", "fails", "quiet", "written", "missing")
    )
    assert (ok["exitCode"], ok["reason"], ok["message"]) == (0, "Completed", "all good\n")
    assert (fails["exitCode"], fails["reason"]) == (3, "Error")
    assert fails["message"] == "first line\nboom"
    assert (quiet["exitCode"], quiet.get("message")) == (4, None)
    assert (written["exitCode"], written["message"]) == (5, "chosen\n")
    assert (missing["exitCode"], missing["reason"]) == (128, "StartError")
    assert "no-such-binary-tr" in missing["message"]


def test_failing_init_container_fails_the_pod(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    pod = make_pod(
        "badinit",
        runner.node,
        [sh("main", "exit 0")],
        init=[
            sh(
                "restore",
                "echo corrupt >&2; exit 3",
                terminationMessagePolicy="FallbackToLogsOnError",
            )
        ],
    )
    create(core_v1, namespace, pod)
    done = wait_phase(core_v1, namespace, "badinit", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Failed"
    assert terminated(done, "restore")["exitCode"] == 3
    assert terminated(done, "restore")["message"] == "corrupt"
    assert statuses(done)["main"]["state"]["waiting"]["reason"] == "PodInitializing"
    assert condition(done, "Initialized")["status"] == "False"
    assert not (runner.pod_dir(namespace, "badinit") / "main.log").exists()


def test_eviction_terms_main_then_sidecar_within_grace_and_pod_goes(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    sidecar = sh(
        "sync",
        "trap 'echo sidecar-term $(date +%s.%N); exit 0' TERM; while true; do sleep 0.1; done",
        restartPolicy="Always",
    )
    polite = sh(
        "polite",
        "trap 'echo main-term $(date +%s.%N); sleep 1; exit 0' TERM;"
        " while true; do sleep 0.1; done",
    )
    stubborn = sh("stubborn", "trap 'echo ignoring' TERM; while true; do sleep 0.1; done")
    create(
        core_v1,
        namespace,
        make_pod("evicted", runner.node, [polite, stubborn], init=[sidecar], grace=3),
    )
    wait_phase(core_v1, namespace, "evicted", ("Running",))
    pids = {c: runner.wait_pid(namespace, "evicted", c) for c in ("sync", "polite", "stubborn")}
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="evicted", namespace=namespace))

    started = time.monotonic()
    final = final_object_after(
        core_v1,
        namespace,
        "evicted",
        lambda: core_v1.create_namespaced_pod_eviction("evicted", namespace, eviction),
        timeout_s=30,
    )
    took = time.monotonic() - started
    assert 3 <= took < 15, f"pod gone after {took:.1f}s with a 3s grace"
    assert condition(final, "DisruptionTarget")["reason"] == "EvictionByEvictionAPI"
    assert final["status"]["phase"] == "Failed"
    assert terminated(final, "polite")["exitCode"] == 0
    assert terminated(final, "stubborn")["exitCode"] == 137
    assert terminated(final, "sync")["exitCode"] == 0
    (main_term,) = re.findall(r"main-term (\S+)", runner.log_of(namespace, "evicted", "polite"))
    (side_term,) = re.findall(r"sidecar-term (\S+)", runner.log_of(namespace, "evicted", "sync"))
    assert float(side_term) > float(main_term) + 1, (
        "the sidecar was stopped before the main containers ended"
    )
    assert "ignoring" in runner.log_of(namespace, "evicted", "stubborn")
    assert not any(pid_alive(p) for p in pids.values())


def test_sigkill_of_a_container_process_gives_137(
    runner: RunnerHandle, core_v1: Any, namespace: str
) -> None:
    create(core_v1, namespace, make_pod("killed", runner.node, [sh("trainer", "sleep 300")]))
    pid = runner.wait_pid(namespace, "killed", "trainer")
    os.kill(pid, signal.SIGKILL)
    done = wait_phase(core_v1, namespace, "killed", ("Succeeded", "Failed"))
    end = terminated(done, "trainer")
    assert (done["status"]["phase"], end["exitCode"], end["reason"]) == ("Failed", 137, "Error")
    assert runner.pid_of(namespace, "killed", "trainer") is None


@pytest.mark.parametrize("how", ["exits", "deleted"])
def test_a_containers_processes_in_a_session_of_their_own_end_with_it(
    runner: RunnerHandle, core_v1: Any, namespace: str, tmp_path: Path, how: str
) -> None:
    """A child that started its own session (torchrun's workers do) escapes a signal to the
    container's process group; it ends with its container all the same, as in a runtime."""
    pidfile = tmp_path / "child.pid"
    wait = "sleep 2" if how == "exits" else "sleep 300"
    script = f"setsid sleep 600 & echo $! > {pidfile}; {wait}"
    create(core_v1, namespace, make_pod("orphan", runner.node, [sh("trainer", script)]))
    child = wait_for(lambda: pidfile.exists() and int(pidfile.read_text() or 0), 30, "the child")
    assert pid_alive(child)
    if how == "deleted":
        core_v1.delete_namespaced_pod("orphan", namespace, grace_period_seconds=1)

    wait_for(lambda: not pid_alive(child), 30, "the child gone with its container")


# ---------------------------------------------------------------------------------------------
# the runner itself and its node


def test_runner_sigterm_stops_every_process_as_a_node_shutdown(
    localenv: LocalEnv, core_v1: Any, namespace: str
) -> None:
    handle = start_runner(localenv, shutdown_grace_s=3)
    try:
        sidecar = sh("sync", "while true; do sleep 0.1; done", restartPolicy="Always")
        main = sh("trainer", "sleep 300 & sleep 300 & wait")  # children share the process group
        create(core_v1, namespace, make_pod("shut", handle.node, [main], init=[sidecar], grace=30))
        wait_phase(core_v1, namespace, "shut", ("Running",))
        pids = [handle.wait_pid(namespace, "shut", c) for c in ("sync", "trainer")]
        children_of = Path(f"/proc/{pids[1]}/task/{pids[1]}/children")

        def both_children() -> list[int] | None:  # the shell forks them after it started
            found = [int(p) for p in children_of.read_text().split()]
            return found if len(found) == 2 else None

        children = wait_for(both_children, 10, "the trainer's two children")
        started = time.monotonic()
        assert handle.stop(delete_node=False) == 0
        assert time.monotonic() - started < 20
        assert not any(pid_alive(p) for p in pids + children)
        pod = read(core_v1, namespace, "shut")
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["reason"] == "Terminated"
        assert condition(pod, "DisruptionTarget")["reason"] == "TerminationByKubelet"
        assert node_ready(core_v1, handle.node) == "False"
    finally:
        handle.stop()


def test_node_reports_not_ready_and_ready_again(localenv: LocalEnv, core_v1: Any) -> None:
    with start_runner(localenv) as handle:
        assert node_ready(core_v1, handle.node) == "True"
        handle.report_not_ready()
        wait_for(lambda: node_ready(core_v1, handle.node) == "False", 15, "Ready=False")
        handle.make_ready()
        wait_for(lambda: node_ready(core_v1, handle.node) == "True", 15, "Ready=True")


def _duration_s(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", text))


def controller_node_timing(env: LocalEnv) -> tuple[float, float]:
    """(grace, period) of the running kube-controller-manager's node monitor, from kwokctl's
    cluster config (kwokctl scales both by its heartbeat factor)."""
    cluster = localenv_mod.CACHE / "kwok" / "clusters" / env.name / "kwok.yaml"
    grace, period = 40.0, 5.0  # the controller-manager's own defaults
    for doc in yaml.safe_load_all(cluster.read_text()):
        for component in (doc or {}).get("components") or []:
            if component.get("name") != "kube-controller-manager":
                continue
            for arg in component.get("args") or []:
                if arg.startswith("--node-monitor-grace-period="):
                    grace = _duration_s(arg.split("=", 1)[1])
                if arg.startswith("--node-monitor-period="):
                    period = _duration_s(arg.split("=", 1)[1])
    return grace, period


def _lease_or_none(coordination: Any, node: str) -> Any:
    try:
        return coordination.read_namespaced_lease(node, "kube-node-lease")
    except ApiException as e:
        if e.status != 404:
            raise
        return None


def test_stopped_heartbeats_make_the_node_not_ready(localenv: LocalEnv, core_v1: Any) -> None:
    grace, period = controller_node_timing(localenv)
    coordination = client.CoordinationV1Api(core_v1.api_client)
    with start_runner(localenv) as handle:
        # The node turns Ready before its first Lease renewal may have landed.
        lease = wait_for(
            lambda: _lease_or_none(coordination, handle.node), 30, "the node's first Lease"
        )
        assert lease.spec.holder_identity == handle.node
        handle.make_not_ready()
        stopped = time.monotonic()
        time.sleep(1)  # a renewal already under way when the signal came may still land
        renewed = coordination.read_namespaced_lease(handle.node, "kube-node-lease").spec.renew_time
        wait_for(
            lambda: node_ready(core_v1, handle.node) == "Unknown",
            grace + 2 * period + 30,
            f"node Ready=Unknown (controller grace {grace:.0f}s, period {period:.0f}s)",
        )
        took = time.monotonic() - stopped
        assert took >= grace - 15, f"NotReady after {took:.0f}s, before the {grace:.0f}s grace"
        lease = coordination.read_namespaced_lease(handle.node, "kube-node-lease")
        assert lease.spec.renew_time == renewed, "the lease was renewed after heartbeats stopped"
        wait_for(
            lambda: any(
                t.key == "node.kubernetes.io/unreachable"
                for t in core_v1.read_node(handle.node).spec.taints or []
            ),
            period + 15,
            "the node-lifecycle controller's unreachable taint",
        )
        print(f"node NotReady {took:.0f}s after heartbeats stopped (grace {grace:.0f}s)")


# ---------------------------------------------------------------------------------------------
# a network partition between the runner and the API server


def partition_pods(core: Any, namespace: str, node: str) -> None:
    """``kept``: a ticking trainer and a sidecar (credentials from a Secret) that exits once
    when told to; ``ender``: a trainer that exits 0 when told to."""
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="creds"), string_data={"KEY": "k-42"}),
    )
    key_env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "KEY"}}}]
    sidecar = sh(
        "sync",
        f"trap 'exit 0' TERM; if [ -e {SCRATCH}/crashed ]; then"
        f' echo "$KEY" > {SCRATCH}/key-after-restart; else'
        f" while [ ! -e {SCRATCH}/crash ]; do sleep 0.1; done; touch {SCRATCH}/crashed; exit 1;"
        " fi; while true; do sleep 0.1; done",
        restartPolicy="Always",
        env=key_env,
        volumeMounts=data_mount(),
    )
    ticker = sh(
        "trainer",
        f"while true; do date +%s.%N >> {SCRATCH}/ticks; sleep 0.1; done",
        volumeMounts=data_mount(),
    )
    create(core, namespace, make_pod("kept", node, [ticker], init=[sidecar], grace=3))
    ender = sh(
        "trainer", f"while [ ! -e {SCRATCH}/go ]; do sleep 0.1; done", volumeMounts=data_mount()
    )
    create(core, namespace, make_pod("ender", node, [ender]))
    for name in ("kept", "ender"):
        wait_phase(core, namespace, name, ("Running",))


def pod_exists(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    return True


def test_partition_keeps_deleted_pods_running_until_healed(
    localenv: LocalEnv, core_v1: Any, namespace: str
) -> None:
    coordination = client.CoordinationV1Api(core_v1.api_client)
    with start_runner(localenv) as handle:

        def renew_time() -> Any:
            return coordination.read_namespaced_lease(handle.node, LEASE_NAMESPACE).spec.renew_time

        wait_for(lambda: _lease_or_none(coordination, handle.node), 30, "the node's first Lease")
        partition_pods(core_v1, namespace, handle.node)
        kept = handle.pod_dir(namespace, "kept") / "volumes" / "data"

        handle.partition()
        time.sleep(1)  # a call already under way when the signal came may still land
        cut_at, renewed = time.monotonic(), renew_time()
        core_v1.delete_namespaced_pod("kept", namespace, grace_period_seconds=0)
        assert not pod_exists(core_v1, namespace, "kept"), "a force delete removes the object"
        (kept / "crash").write_text("")  # the sidecar exits 1 and must restart, link or not
        (handle.pod_dir(namespace, "ender") / "volumes" / "data" / "go").write_text("")
        wait_for((kept / "key-after-restart").exists, 15, "the sidecar restarted")
        assert (kept / "key-after-restart").read_text() == "k-42\n"
        pids = [handle.wait_pid(namespace, "kept", c) for c in ("sync", "trainer")]
        ticks = len((kept / "ticks").read_text().splitlines())
        time.sleep(max(0.0, cut_at + LEASE_RENEW_S + 1 - time.monotonic()))  # past a renewal

        assert all(pid_alive(p) for p in pids), "a partitioned node's processes stopped"
        assert len((kept / "ticks").read_text().splitlines()) > ticks + 20
        assert handle.pid_of(namespace, "ender", "trainer") is None, "ender's trainer runs"
        assert read(core_v1, namespace, "ender")["status"]["phase"] == "Running"
        assert renew_time() == renewed, "the lease was renewed while partitioned"

        handle.heal()
        wait_for(lambda: not any(pid_alive(p) for p in pids), 3 + 15, "kept's processes stopped")
        done = wait_phase(core_v1, namespace, "ender", ("Succeeded", "Failed"), timeout_s=15)
        assert done["status"]["phase"] == "Succeeded"
        wait_for(lambda: node_ready(core_v1, handle.node) == "True", 15, "Ready after the heal")
        wait_for(lambda: renew_time() != renewed, 15, "the lease renewed after the heal")
