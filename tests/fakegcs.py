"""fake-gcs-server, the Google Cloud Storage emulator the GCS store is checked against.

- The binary: built from its Go module by hack/build-fake-gcs.sh (one pinned version) into the
  user's cache, so a warm ``binary()`` returns at once.
- ``FakeGcs``: one emulator process with an in-memory backend on a free port of 127.0.0.1 only
  (``-host 127.0.0.1``; the gRPC API shares that listener), plain HTTP, with the bucket
  ``trainingrun`` created. Its log goes to ``fake-gcs-server.log`` in the folder the caller
  passes. Every ``FAKE_GCS_*`` variable of the caller's environment is dropped, so only the
  flags here decide where it listens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.localenv import free_ports, hack_output

BUCKET = "trainingrun"
READY_TIMEOUT_S = 30
LOG_FILE = "fake-gcs-server.log"
# Loopback is never reached through a proxy the caller's environment may name.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def binary() -> Path:
    """Builds (or finds cached) fake-gcs-server; returns its path. The script's progress goes
    to this process's stderr."""
    return hack_output("build-fake-gcs.sh")


class FakeGcs:
    """One emulator process on loopback; ``endpoint`` is its base URL (the ``api_endpoint``
    of a storage client), ``bucket`` the bucket made at start."""

    def __init__(self, state_dir: Path, bucket: str = BUCKET) -> None:
        self.state_dir = state_dir
        self.bucket = bucket
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_FILE

    def start(self) -> FakeGcs:
        exe = binary()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        args = [
            str(exe),
            "-scheme=http",
            "-host=127.0.0.1",
            f"-port={self.port}",
            f"-public-host=127.0.0.1:{self.port}",
            f"-external-url={self.endpoint}",
            "-backend=memory",
            "-log-level=warn",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_GCS_")}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.state_dir,
                start_new_session=True,
            )
        try:
            self._wait_ready()
            self._create_bucket()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"fake-gcs-server exited during start; end of its log:\n{tail}")
            with (
                contextlib.suppress(OSError),
                _OPENER.open(f"{self.endpoint}/_internal/healthcheck", timeout=2),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"fake-gcs-server not ready after {READY_TIMEOUT_S}s; see {self.log_path}"
        )

    def _create_bucket(self) -> None:
        body = json.dumps({"name": self.bucket}).encode()
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with _OPENER.open(req, timeout=10):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already there
                raise

    def stop(self, grace_s: float = 5) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> FakeGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
