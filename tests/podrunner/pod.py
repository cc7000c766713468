"""One pod's life on the local node, lived the way the kubelet lives it (``restartPolicy: Never``
only): volumes, init containers in order, native sidecars up before what follows them and down
after the main containers, main containers, graceful termination on deletion, status writes, and
the final delete with grace 0.

Each pod has a folder ``<state-dir>/<namespace>_<pod>/`` with, per container, ``<name>.log``,
``<name>.pid`` (while it runs) and ``<name>.termination-log``, and ``volumes/<volume>/``.
"""

from __future__ import annotations

import base64
import copy
import logging
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.podrunner.node import now
from tests.podrunner.process import exit_code, launch, signal_group, stop, which
from tests.podrunner.spec import (
    POD_IP,
    ConfigError,
    command_line,
    container_env,
    downward_files,
    is_sidecar,
    key_files,
    mounts_of,
    termination_message,
    volume_kind,
)

log = logging.getLogger("podrunner.pod")

INIT, SIDECAR, MAIN = "init", "sidecar", "main"
TICK_S = 0.2
CONFIG_RETRY_S = 2.0
MIN_SIDECAR_GRACE_S = 2  # the kubelet gives sidecars at least this much after the main ones
SIDECAR_BACKOFF_MAX_S = 10
DEFAULT_GRACE_S = 30
STRATEGIC = "application/strategic-merge-patch+json"  # conditions merge by type
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
LOST_MESSAGE = "The container could not be located when the pod was terminated"
TERMINAL = ("Succeeded", "Failed")


@dataclass
class Context:
    """What every pod worker of one runner shares."""

    core: client.CoreV1Api
    node: str
    state_dir: Path
    shutdown_grace_s: float


@dataclass
class Container:
    spec: dict[str, Any]
    kind: str
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "PodInitializing"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    proc: subprocess.Popen[bytes] | None = None
    container_id: str = ""
    started_once: bool = False
    restart_at: float | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])


def write_atomic(folder: Path, files: dict[str, str]) -> None:
    """Writes a volume's files the way the kubelet's atomic writer does: a fresh timestamped
    folder, the ``..data`` symlink swapped by rename, and one symlink per top-level name."""
    folder.mkdir(parents=True, exist_ok=True)
    fresh = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
    fresh.mkdir()
    for rel, content in files.items():
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        (fresh / rel).write_text(content)
    tmp = folder / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(fresh.name)
    tmp.replace(folder / "..data")
    for top in {rel.split("/")[0] for rel in files}:
        link = folder / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for old in folder.glob("..*_*"):
        if old.is_dir() and not old.is_symlink() and old.name != fresh.name:
            shutil.rmtree(old, ignore_errors=True)


def _unready(names: list[str], what: str) -> str:
    return f"containers with {what} status: [{' '.join(names)}]"


class PodWorker:
    """Runs one pod in a thread of its own; the runner feeds it pod updates."""

    def __init__(self, ctx: Context, pod: dict[str, Any]) -> None:
        self.ctx = ctx
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.dir = ctx.state_dir / f"{self.namespace}_{self.name}"
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        spec = pod["spec"]
        self.containers = [
            Container(c, SIDECAR if is_sidecar(c) else INIT)
            for c in spec.get("initContainers") or []
        ] + [Container(c, MAIN) for c in spec["containers"]]
        self.deleting = bool(meta.get("deletionTimestamp"))
        self.gone = False
        self.shutdown = False
        self.sandbox = False
        self.stopping = False  # no sidecar restarts from here on
        self.done = False  # every container stopped
        self.lost = False
        self.shut_down = False
        self.start_time: str | None = None
        self.volume_dirs: dict[str, Path] = {}
        self.downward: dict[str, dict[str, str]] = {}
        self.transitions: dict[str, tuple[str, str]] = {}
        self.last_status: dict[str, Any] | None = None
        self.thread = threading.Thread(
            target=self.run, name=f"pod {self.namespace}/{self.name}", daemon=True
        )

    # -- inputs from the runner ----------------------------------------------------------------

    def update(self, pod: dict[str, Any]) -> None:
        with self._lock:
            self._pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self.deleting = True
        self._wake.set()

    def mark_gone(self) -> None:
        self.gone = True
        self._wake.set()

    def request_shutdown(self) -> None:
        self.shutdown = True
        self._wake.set()

    def pod(self) -> dict[str, Any]:
        with self._lock:
            return self._pod

    def stop_requested(self) -> bool:
        return self.deleting or self.gone or self.shutdown

    # -- the life ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("pod %s/%s: runner error", self.namespace, self.name)
        finally:
            for c in self.containers:
                if c.proc and c.proc.poll() is None:
                    signal_group(c.proc.pid, signal.SIGKILL)
                    c.proc.wait(timeout=10)

    def _live(self) -> None:
        status = self.pod().get("status") or {}
        if status.get("phase") in TERMINAL:
            self.done = True
            self.last_status = {}  # never rewrite what an earlier runner wrote
            self._await_end()
            return
        if self._ran_before(status):
            self._mark_lost(status)
            self._await_end()
            return
        log.info("pod %s/%s: starting", self.namespace, self.name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.start_time = now()
        while not self._prepare_volumes():
            if self.stop_requested():
                break
            self._tick(CONFIG_RETRY_S)
        if self.sandbox and not self.stop_requested() and self._run_init_containers():
            self._run_main_containers()
        self._terminate()
        self.done = True
        self._write_status()
        log.info("pod %s/%s: %s", self.namespace, self.name, self._phase())
        self._await_end()

    def _prepare_volumes(self) -> bool:
        pod = self.pod()
        root = self.dir / "volumes"
        try:
            for v in pod["spec"].get("volumes") or []:
                kind = volume_kind(v)
                path = root / v["name"]
                if kind == "emptyDir":
                    path.mkdir(parents=True, exist_ok=True)
                elif kind == "downwardAPI":
                    files = downward_files(v, pod)
                    write_atomic(path, files)
                    self.downward[v["name"]] = files
                elif kind == "hostPath":
                    path = Path(v["hostPath"]["path"])
                    if v["hostPath"].get("type") == "DirectoryOrCreate":
                        path.mkdir(parents=True, exist_ok=True)
                elif kind == "projected":
                    write_atomic(path, self._projected_files(v, pod))
                else:
                    write_atomic(path, self._key_files(v[kind], kind))
                self.volume_dirs[v["name"]] = path
        except ConfigError as e:
            for c in self.containers:
                c.state = {"waiting": {"reason": "ContainerCreating", "message": str(e)}}
            return False
        self.sandbox = True
        for c in self.containers:
            if c.state.get("waiting", {}).get("reason") == "ContainerCreating":
                c.state = {"waiting": {"reason": "PodInitializing"}}
        return True

    def _key_files(self, source: dict[str, Any], kind: str) -> dict[str, str]:
        """The files of a secret or configMap volume (or projected source)."""
        ref = source.get("secretName") or source.get("name") or ""
        data = self._lookup("Secret" if kind == "secret" else "ConfigMap", self.namespace, ref)
        if data is None and not source.get("optional"):
            raise ConfigError(f'{kind} "{ref}" not found')
        return key_files(source, data or {})

    def _projected_files(self, volume: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
        """A projected volume (such as the service account's ``kube-api-access-*``); its token
        comes from the TokenRequest API, bound to the pod, as the kubelet gets it."""
        files: dict[str, str] = {}
        for source in volume["projected"].get("sources") or []:
            if "downwardAPI" in source:
                files.update(downward_files({"name": volume["name"], **source}, pod))
            elif "secret" in source or "configMap" in source:
                kind = "secret" if "secret" in source else "configMap"
                files.update(self._key_files(source[kind], kind))
            elif "serviceAccountToken" in source:
                files[source["serviceAccountToken"]["path"]] = self._token(
                    source["serviceAccountToken"], pod
                )
            else:
                raise ConfigError(f"volume {volume['name']}: projected source {list(source)}")
        return files

    def _token(self, source: dict[str, Any], pod: dict[str, Any]) -> str:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[source["audience"]] if source.get("audience") else [],
                expiration_seconds=source.get("expirationSeconds", 3600),
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=self.name, uid=self.uid
                ),
            )
        )
        account = pod["spec"].get("serviceAccountName") or "default"
        try:
            answer = self.ctx.core.create_namespaced_service_account_token(
                account, self.namespace, request
            )
        except ApiException as e:
            raise ConfigError(f"token of service account {account}: {e.reason}") from e
        return str(answer.status.token)

    def _run_init_containers(self) -> bool:
        for c in self.containers:
            if c.kind == MAIN:
                continue
            if self.stop_requested():
                return False
            while not self._start(c):
                if self.stop_requested():
                    return False
                self._tick(CONFIG_RETRY_S)
            if c.kind == SIDECAR:
                continue
            while c.proc is not None:
                if self.stop_requested():
                    return False
                self._tick()
            if c.exit_code != 0:
                log.info("pod %s/%s: init container %s failed", self.namespace, self.name, c.name)
                return False
        return True

    def _run_main_containers(self) -> None:
        pending = [c for c in self.containers if c.kind == MAIN]
        while pending and not self.stop_requested():
            pending = [c for c in pending if not self._start(c)]
            if not pending or self.stop_requested():
                break
            self._tick(CONFIG_RETRY_S)
        while not self.stop_requested() and any(c.proc for c in self.containers if c.kind == MAIN):
            self._tick()

    def _grace_s(self) -> float:
        pod = self.pod()
        grace = pod["metadata"].get("deletionGracePeriodSeconds") if self.deleting else None
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        if self.shutdown and not self.deleting:
            grace = min(grace, self.ctx.shutdown_grace_s)
        return float(grace)

    def _terminate(self) -> None:
        """SIGTERM, grace, SIGKILL: main (and running init) containers first, then the
        sidecars one by one in reverse order, within the same deadline."""
        self.stopping = True
        was_shutdown = self.shutdown and not self._all_mains_ended()
        deadline = time.monotonic() + self._grace_s()
        first = [c for c in self.containers if c.kind != SIDECAR and c.proc]
        if first:
            log.info("pod %s/%s: stopping %s", self.namespace, self.name, [c.name for c in first])
        stop([c.proc for c in first if c.proc], deadline)
        for c in first:
            self._reap(c)
        self._write_status()
        for c in reversed([c for c in self.containers if c.kind == SIDECAR]):
            c.restart_at = None
            if c.proc:
                stop([c.proc], max(deadline, time.monotonic() + MIN_SIDECAR_GRACE_S))
                self._reap(c)
            elif "waiting" in c.state and c.last_state:
                c.state, c.last_state = c.last_state, {}
        self.shut_down = was_shutdown

    def _all_mains_ended(self) -> bool:
        return all("terminated" in c.state for c in self.containers if c.kind == MAIN)

    def _await_end(self) -> None:
        """A terminal pod stays until it is deleted; then it goes, with grace 0."""
        while not self.stop_requested():
            self._tick(1.0)
        if self.deleting and not self.gone:
            self._write_status()
            try:
                self.ctx.core.delete_namespaced_pod(
                    self.name,
                    self.namespace,
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
                    ),
                )
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
            log.info("pod %s/%s: deleted", self.namespace, self.name)
        if self.deleting or self.gone:
            shutil.rmtree(self.dir / "volumes", ignore_errors=True)

    # -- containers ----------------------------------------------------------------------------

    def _file(self, c: Container, suffix: str) -> Path:
        return self.dir / f"{c.name}.{suffix}"

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "Secret":
                secret = self.ctx.core.read_namespaced_secret(name, namespace)
                return {
                    k: base64.b64decode(v).decode(errors="replace")
                    for k, v in (secret.data or {}).items()
                }
            config_map = self.ctx.core.read_namespaced_config_map(name, namespace)
            return dict(config_map.data or {})
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _start(self, c: Container) -> bool:
        """Starts ``c``; False when it cannot be configured yet (it then waits with
        ``CreateContainerConfigError``, as the kubelet shows it)."""
        pod = self.pod()
        term = self._file(c, "termination-log")
        try:
            env = container_env(pod, c.spec, self._lookup)
            mounts = mounts_of(c.spec, self.volume_dirs, term)
        except ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            return False
        term.write_bytes(b"")
        started = now()
        c.started_once = True
        c.container_id = f"local://{self.namespace}_{self.name}/{c.name}/{c.restarts}"
        try:
            argv = command_line(c.spec, env)
            if which(argv[0], env.get("PATH", "")) is None:
                raise ValueError(f'exec: "{argv[0]}": executable file not found in $PATH')
        except ValueError as e:
            c.state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": str(e),
                    "startedAt": started,
                    "finishedAt": started,
                    "containerID": c.container_id,
                }
            }
            return True
        c.proc = launch(argv, env, mounts, c.spec.get("workingDir"), self._file(c, "log"))
        self._file(c, "pid").write_text(str(c.proc.pid))
        c.state = {"running": {"startedAt": started}}
        c.restart_at = None
        log.info("pod %s/%s: %s started (pid %d)", self.namespace, self.name, c.name, c.proc.pid)
        return True

    def _reap(self, c: Container) -> bool:
        """Records the end of ``c`` when its process has exited; True when it just did."""
        if c.proc is None or c.proc.poll() is None:
            return False
        code = exit_code(c.proc.returncode)
        signal_group(c.proc.pid, signal.SIGKILL)  # what it left behind goes with it
        c.proc = None
        self._file(c, "pid").unlink(missing_ok=True)
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.state.get("running", {}).get("startedAt"),
            "finishedAt": now(),
            "containerID": c.container_id,
        }
        if code > 128:
            term["signal"] = code - 128
        message = termination_message(
            c.spec, self._file(c, "termination-log"), self._file(c, "log"), code
        )
        if message:
            term["message"] = message
        c.state = {"terminated": term}
        log.info("pod %s/%s: %s exited %d", self.namespace, self.name, c.name, code)
        return True

    def _sidecar_restarts(self) -> None:
        """Native sidecars restart whenever they exit before the pod stops (with backoff)."""
        for c in self.containers:
            if c.kind != SIDECAR:
                continue
            if self._reap(c) and not self.stopping:
                c.last_state, c.restarts = c.state, c.restarts + 1
                delay = min(SIDECAR_BACKOFF_MAX_S, 2 ** (c.restarts - 1))
                c.restart_at = time.monotonic() + delay
                c.state = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {delay}s restarting failed container={c.name} "
                        f"pod={self.name}_{self.namespace}({self.uid})",
                    }
                }
            due = c.restart_at is not None and time.monotonic() >= c.restart_at
            if due and not self.stopping and not self._start(c):
                c.restart_at = time.monotonic() + CONFIG_RETRY_S

    def _tick(self, wait_s: float = TICK_S) -> None:
        """One beat: refresh downward API files, notice exits, write the status, then wait."""
        self._refresh_downward()
        for c in self.containers:
            if c.kind != SIDECAR:
                self._reap(c)
        self._sidecar_restarts()
        self._write_status()
        self._wake.wait(wait_s)
        self._wake.clear()

    def _refresh_downward(self) -> None:
        if not self.sandbox or self.done:
            return
        pod = self.pod()
        for v in pod["spec"].get("volumes") or []:
            if "downwardAPI" not in v:
                continue
            try:
                files = downward_files(v, pod)
            except ConfigError:
                continue
            if files != self.downward.get(v["name"]):
                write_atomic(self.volume_dirs[v["name"]], files)
                self.downward[v["name"]] = files

    # -- status --------------------------------------------------------------------------------

    def _ran_before(self, status: dict[str, Any]) -> bool:
        """An earlier runner process started this pod's containers; they are gone now."""
        seen = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
        return any(
            "running" in s.get("state", {}) or "terminated" in s.get("state", {}) for s in seen
        )

    def _mark_lost(self, status: dict[str, Any]) -> None:
        previous = {
            s["name"]: s
            for s in (status.get("initContainerStatuses") or [])
            + (status.get("containerStatuses") or [])
        }
        for c in self.containers:
            state = previous.get(c.name, {}).get("state", {})
            if "terminated" in state:
                c.state = {"terminated": state["terminated"]}
            elif "running" in state:
                c.state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "ContainerStatusUnknown",
                        "message": LOST_MESSAGE,
                        "startedAt": state["running"].get("startedAt"),
                        "finishedAt": now(),
                    }
                }
        self.lost = True
        self.done = True
        self.start_time = status.get("startTime")
        log.info("pod %s/%s: lost with an earlier runner, marked Failed", self.namespace, self.name)
        self._write_status()

    def _phase(self) -> str:
        if self.lost or self.shut_down:
            return "Failed"
        mains = [c for c in self.containers if c.kind == MAIN]
        if self.done:
            if all(c.exit_code == 0 for c in mains):
                return "Succeeded"
            return "Failed"
        if any("waiting" not in c.state for c in mains):
            return "Running"
        return "Pending"

    def _condition(
        self, kind: str, ok: bool, reason: str = "", message: str = ""
    ) -> dict[str, Any]:
        status = "True" if ok else "False"
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != status:
            self.transitions[kind] = (status, now())
        # None clears what an earlier write set: conditions are merged by type.
        return {
            "type": kind,
            "status": status,
            "lastTransitionTime": self.transitions[kind][1],
            "reason": reason or None,
            "message": message or None,
        }

    def _conditions(self, phase: str) -> list[dict[str, Any]]:
        incomplete = [
            c.name
            for c in self.containers
            if (c.kind == INIT and c.exit_code != 0) or (c.kind == SIDECAR and not c.started_once)
        ]
        unready = [c.name for c in self.containers if c.kind != INIT and not c.running]
        if phase in TERMINAL:
            ready_args: tuple[str, str] = ("PodCompleted", "")
        else:
            ready_args = (
                ("ContainersNotReady", _unready(unready, "unready")) if unready else ("", "")
            )
        conditions = [
            self._condition("PodReadyToStartContainers", self.sandbox and not self.done),
            self._condition(
                "Initialized",
                not incomplete,
                *(
                    ("ContainersNotInitialized", _unready(incomplete, "incomplete"))
                    if incomplete
                    else ()
                ),
            ),
            self._condition("ContainersReady", not unready and phase == "Running", *ready_args),
            self._condition("Ready", not unready and phase == "Running", *ready_args),
        ]
        known = {c.get("type") for c in (self.pod().get("status") or {}).get("conditions") or []}
        if "PodScheduled" not in known:
            conditions.append(self._condition("PodScheduled", True))
        if self.shut_down:
            conditions.append(
                self._condition("DisruptionTarget", True, "TerminationByKubelet", SHUTDOWN_MESSAGE)
            )
        return conditions

    def _container_status(self, c: Container) -> dict[str, Any]:
        ready = c.exit_code == 0 if c.kind == INIT else c.running
        status: dict[str, Any] = {
            "name": c.name,
            "image": c.spec.get("image", ""),
            "imageID": "",
            "ready": ready,
            "restartCount": c.restarts,
            "started": c.running,
            "state": c.state,
        }
        if c.container_id:
            status["containerID"] = c.container_id
        if c.last_state:
            status["lastState"] = c.last_state
        return status

    def _write_status(self) -> None:
        if self.gone or self.last_status == {}:
            return
        phase = self._phase()
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": self._conditions(phase),
            "initContainerStatuses": [
                self._container_status(c) for c in self.containers if c.kind != MAIN
            ],
            "containerStatuses": [
                self._container_status(c) for c in self.containers if c.kind == MAIN
            ],
            "hostIP": POD_IP,
            "hostIPs": [{"ip": POD_IP}],
        }
        if self.sandbox:
            status["podIP"] = POD_IP
            status["podIPs"] = [{"ip": POD_IP}]
        if self.start_time:
            status["startTime"] = self.start_time
        if self.shut_down:
            status["reason"] = SHUTDOWN_REASON
            status["message"] = SHUTDOWN_MESSAGE
        if status == self.last_status:
            return
        try:
            self.ctx.core.patch_namespaced_pod_status(
                self.name, self.namespace, {"status": status}, _content_type=STRATEGIC
            )
        except ApiException as e:
            if e.status == 404:
                self.gone = True
                return
            log.warning("pod %s/%s: status not written: %s", self.namespace, self.name, e.body)
            return
        except Exception as e:  # the API may be briefly away; the next tick retries
            log.warning("pod %s/%s: status not written: %s", self.namespace, self.name, e)
            return
        self.last_status = copy.deepcopy(status)
