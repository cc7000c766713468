"""A test server's process, as fake-gcs-server, MinIO and Azurite run: started in a session of
its own with its output in a log file, ready once a health URL on loopback answers (Azurite has
a readiness rule of its own), stopped with its whole process group. ``Server`` is what they
share: a folder, a port on 127.0.0.1, a log.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import ClassVar, Self

from tests.localenv import stop_pid

# Loopback is never reached through a proxy the caller's environment may name.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def spawn(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Starts ``args`` in the log's folder, in a new session, stdout and stderr to the log."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_path.parent,
            start_new_session=True,
        )


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, name: str, log_path: Path, timeout_s: float
) -> None:
    """Until ``url`` answers 2xx; raises with the end of the log when ``proc`` exits first,
    or naming the log after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited during start; end of its log:\n{tail}")
        with contextlib.suppress(OSError), _OPENER.open(url, timeout=2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready after {timeout_s:g}s; see {log_path}")


def stop(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM to ``proc``'s group, SIGKILL after ``grace_s`` (``localenv.stop_pid``); waits
    for it."""
    if proc is None or proc.poll() is not None:
        return
    stop_pid(proc.pid, grace_s)
    proc.wait()


class Server:
    """One server on a port of 127.0.0.1, its log and state in ``state_dir``; a subclass
    starts it (``start`` sets ``port`` and ``proc``) and names its log."""

    LOG_FILE: ClassVar[str]
    STOP_GRACE_S: ClassVar[float] = 5

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / self.LOG_FILE

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop(proc, self.STOP_GRACE_S)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
