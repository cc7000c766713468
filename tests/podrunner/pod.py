"""One pod's life on the local node, lived the way the kubelet lives it (``restartPolicy: Never``
only): volumes, init containers in order, native sidecars up before what follows them and down
after the main containers, main containers, graceful termination on deletion, status writes, and
the final delete with grace 0. While the runner's link to the API server is cut (a simulated
partition, ``tests.podrunner.link``) the pod goes on with what it knows: no status write, no final
delete, and Secrets and ConfigMaps only from what it looked up before (a sidecar restart still
finds its credentials, as a kubelet's cache would).

Each pod has a folder ``<state-dir>/<namespace>_<pod>/`` with, per container, ``<name>.log``,
``<name>.pid`` (while it runs) and ``<name>.termination-log``, and ``volumes/<volume>/``. A pod
with a subdomain also gets a network of its own (``tests.podrunner.podnet``), set up with its
volumes and removed once its containers have stopped; its ``hosts`` file is in that folder too.
"""

from __future__ import annotations

import copy
import logging
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.podrunner.link import Link
from tests.podrunner.node import now
from tests.podrunner.podapi import PodApi, PodGone
from tests.podrunner.podnet import Networks, PodNet, wants_network
from tests.podrunner.process import (
    await_mount_ns,
    exit_code,
    hold_mount_ns,
    kill_leftovers,
    launch,
    release_mount_ns,
    signal_group,
    stop,
    which,
)
from tests.podrunner.spec import (
    POD_IP,
    ConfigError,
    command_line,
    container_env,
    is_sidecar,
    mounts_of,
    termination_message,
)
from tests.podrunner.status import (
    INIT,
    MAIN,
    SIDECAR,
    TERMINAL,
    Container,
    Progress,
    Transitions,
    mark_lost,
    phase,
    pod_status,
    ran_before,
)
from tests.podrunner.volumes import PodVolumes

log = logging.getLogger("podrunner.pod")

TICK_S = 0.2
CONFIG_RETRY_S = 2.0
MIN_SIDECAR_GRACE_S = 2  # the kubelet gives sidecars at least this much after the main ones
SIDECAR_BACKOFF_MAX_S = 10
DEFAULT_GRACE_S = 30
TMP_DIR = "tmp"  # in the pod's folder: one folder per container, its TMPDIR


@dataclass
class Context:
    """What every pod worker of one runner shares."""

    core: client.CoreV1Api
    node: str
    state_dir: Path
    shutdown_grace_s: float
    link: Link = field(default_factory=Link)
    networks: Networks | None = None  # None: every pod shares the machine's network


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
        self.net: PodNet | None = None
        self.api = PodApi(ctx.core, ctx.link, self.namespace, self.name, self.uid)
        self.volumes = PodVolumes(
            self.dir / "volumes", self.namespace, self.api.lookup, self.api.token
        )
        self.transitions = Transitions()
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
                kill_leftovers(c.mount_ns)
                release_mount_ns(c.mount_ns_fd)
            if self.net:
                self.net.close()

    def _live(self) -> None:
        status = self.pod().get("status") or {}
        if status.get("phase") in TERMINAL:
            self.done = True
            self.last_status = {}  # never rewrite what an earlier runner wrote
            self._await_end()
            return
        if ran_before(status):
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
        if self.net:
            self.net.close()  # the pod keeps reporting its address, as the kubelet's does
        self.done = True
        self._write_status()
        log.info("pod %s/%s: %s", self.namespace, self.name, self._phase())
        self._await_end()

    def _prepare_volumes(self) -> bool:
        try:
            if self.net is None and self.ctx.networks and wants_network(self.pod()):
                self.net = self.ctx.networks.attach(self.pod(), self.dir / "hosts")
            self.volumes.prepare(self.pod())
        except ConfigError as e:
            for c in self.containers:
                c.state = {"waiting": {"reason": "ContainerCreating", "message": str(e)}}
            return False
        self.sandbox = True
        for c in self.containers:
            if c.state.get("waiting", {}).get("reason") == "ContainerCreating":
                c.state = {"waiting": {"reason": "PodInitializing"}}
        return True

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
        # The final write and delete wait for the link and the API server, unless news of the
        # end comes: a delete lost to an API server restart is sent again, as a kubelet does.
        while self.deleting and not (self.gone or self.shutdown):
            if not self.ctx.link.wait_up(1.0):
                continue
            self._write_status()
            if self.api.delete():
                log.info("pod %s/%s: deleted", self.namespace, self.name)
                break
            self._pause(1.0)
        if self.deleting or self.gone:
            shutil.rmtree(self.dir / "volumes", ignore_errors=True)
            shutil.rmtree(self.dir / TMP_DIR, ignore_errors=True)

    # -- containers ----------------------------------------------------------------------------

    def _file(self, c: Container, suffix: str) -> Path:
        return self.dir / f"{c.name}.{suffix}"

    def _start(self, c: Container) -> bool:
        """Starts ``c``; False when it cannot be configured yet (it then waits with
        ``CreateContainerConfigError``, as the kubelet shows it)."""
        pod = self.pod()
        term = self._file(c, "termination-log")
        try:
            env = container_env(pod, c.spec, self.api.lookup, self._pod_ip())
            mounts = mounts_of(c.spec, self.volumes.dirs, term)
        except ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            return False
        # A container's /tmp is its own, gone with the pod: here a folder of the pod's that the
        # container's temporary files go to (TMPDIR), unless its spec names one.
        scratch = self.dir / TMP_DIR / c.name
        scratch.mkdir(parents=True, exist_ok=True)
        env.setdefault("TMPDIR", str(scratch))
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
        identity = None
        if self.net:
            self.net.forward(env)
            mounts, identity = [self.net.hosts_mount(), *mounts], self.net.identity
        c.proc = launch(argv, env, mounts, c.spec.get("workingDir"), self._file(c, "log"), identity)
        c.mount_ns, c.mount_ns_fd = await_mount_ns(c.proc)
        self._file(c, "pid").write_text(str(c.proc.pid))
        c.state = {"running": {"startedAt": started}}
        c.restart_at = None
        log.info("pod %s/%s: %s started (pid %d)", self.namespace, self.name, c.name, c.proc.pid)
        return True

    def _reap(self, c: Container) -> bool:
        """Records the end of ``c`` when its process has exited; True when it just did."""
        if c.proc is not None and c.proc.poll() is None:
            if not c.mount_ns:
                c.mount_ns, c.mount_ns_fd = hold_mount_ns(c.proc.pid)
            return False
        if c.proc is None:
            return False
        code = exit_code(c.proc.returncode)
        signal_group(c.proc.pid, signal.SIGKILL)  # what it left behind goes with it
        if kill_leftovers(c.mount_ns):
            log.info("pod %s/%s: %s's leftover processes killed", self.namespace, self.name, c.name)
        release_mount_ns(c.mount_ns_fd)
        c.mount_ns, c.mount_ns_fd = "", -1
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
        self._pause(wait_s)

    def _pause(self, wait_s: float) -> None:
        """Waits ``wait_s`` seconds, or less when news of the pod comes."""
        self._wake.wait(wait_s)
        self._wake.clear()

    def _refresh_downward(self) -> None:
        if self.sandbox and not self.done:
            self.volumes.refresh_downward(self.pod())

    # -- status --------------------------------------------------------------------------------

    def _mark_lost(self, status: dict[str, Any]) -> None:
        mark_lost(self.containers, status)
        self.lost = True
        self.done = True
        self.start_time = status.get("startTime")
        log.info("pod %s/%s: lost with an earlier runner, marked Failed", self.namespace, self.name)
        self._write_status()

    def _pod_ip(self) -> str:
        return self.net.ip if self.net else POD_IP

    def _phase(self) -> str:
        return phase(self.containers, self._progress())

    def _progress(self) -> Progress:
        return Progress(
            sandbox=self.sandbox,
            done=self.done,
            lost=self.lost,
            shut_down=self.shut_down,
            start_time=self.start_time,
            pod_ip=self._pod_ip(),
        )

    def _write_status(self) -> None:
        if self.gone or self.last_status == {} or not self.ctx.link.up:
            return  # with the link cut, written once it is back if the pod is still there
        known = {c.get("type") for c in (self.pod().get("status") or {}).get("conditions") or []}
        status = pod_status(self.containers, self._progress(), self.transitions, known)
        if status == self.last_status:
            return
        try:
            written = self.api.write_status(status)
        except PodGone:
            self.gone = True
            return
        if written:
            self.last_status = copy.deepcopy(status)
