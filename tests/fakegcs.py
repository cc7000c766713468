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

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from tests import serverproc
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


class FakeGcs(serverproc.Server):
    """One emulator process on loopback; ``endpoint`` is its base URL (the ``api_endpoint``
    of a storage client), ``bucket`` the bucket made at start."""

    LOG_FILE = LOG_FILE

    def __init__(self, state_dir: Path, bucket: str = BUCKET) -> None:
        super().__init__(state_dir)
        self.bucket = bucket

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
        self.proc = serverproc.spawn(args, self.log_path, env)
        try:
            serverproc.wait_ready(
                self.proc,
                f"{self.endpoint}/_internal/healthcheck",
                "fake-gcs-server",
                self.log_path,
                READY_TIMEOUT_S,
            )
            self._create_bucket()
        except BaseException:
            self.stop()
            raise
        return self

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
