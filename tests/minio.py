"""MinIO, an S3-compatible server the S3 store is checked against beside SeaweedFS.

- The binary: built from its Go module by hack/build-minio.sh (one pinned version) into the
  user's cache, so a warm ``binary()`` returns at once.
- ``Minio``: one server process on free ports of 127.0.0.1 only (the S3 API and the console,
  which is not used), plain HTTP, single drive in the folder the caller passes, with the bucket
  ``trainingrun`` created and random root keys. Its log goes to ``minio.log`` there. Every
  ``MINIO_*`` variable of the caller's environment is dropped, so only what is set here decides.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tests.localenv import free_ports, hack_output

BUCKET = "trainingrun"
REGION = "us-east-1"
READY_TIMEOUT_S = 60
LOG_FILE = "minio.log"
# Loopback is never reached through a proxy the caller's environment may name.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def binary() -> Path:
    """Builds (or finds cached) MinIO; returns its path. The script's progress goes to this
    process's stderr."""
    return hack_output("build-minio.sh")


class Minio:
    """One MinIO server; ``endpoint`` is its S3 URL."""

    def __init__(self, state_dir: Path, bucket: str = BUCKET) -> None:
        self.state_dir = state_dir
        self.bucket = bucket
        self.port = 0
        self.access_key = "tr" + secrets.token_hex(8)
        self.secret_key = secrets.token_urlsafe(30)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_FILE

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def start(self) -> Minio:
        exe = binary()
        data = self.state_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.port, console = free_ports(2)
        args = [
            str(exe),
            "server",
            "--quiet",
            f"--address=127.0.0.1:{self.port}",
            f"--console-address=127.0.0.1:{console}",
            str(data),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
        env.update(
            {
                "MINIO_ROOT_USER": self.access_key,
                "MINIO_ROOT_PASSWORD": self.secret_key,
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
                "MINIO_REGION": REGION,
            }
        )
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
            self.client().create_bucket(Bucket=self.bucket)
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
                raise RuntimeError(f"minio exited during start; end of its log:\n{tail}")
            with (
                contextlib.suppress(OSError),
                _OPENER.open(f"{self.endpoint}/minio/health/ready", timeout=2),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"minio not ready after {READY_TIMEOUT_S}s; see {self.log_path}")

    def stop(self, grace_s: float = 10) -> None:
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

    def __enter__(self) -> Minio:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
