"""MinIO, an S3-compatible server the S3 store is checked against beside SeaweedFS.

- The binary: built from its Go module by hack/build-minio.sh (one pinned version) into the
  user's cache, so a warm ``binary()`` returns at once.
- ``Minio``: one server process on free ports of 127.0.0.1 only (the S3 API and the console,
  which is not used), plain HTTP, single drive in the folder the caller passes, with the bucket
  ``trainingrun`` created and random root keys. Its log goes to ``minio.log`` there. Every
  ``MINIO_*`` variable of the caller's environment is dropped, so only what is set here decides.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tests import serverproc
from tests.localenv import free_ports, hack_output

BUCKET = "trainingrun"
REGION = "us-east-1"
READY_TIMEOUT_S = 60
LOG_FILE = "minio.log"


def binary() -> Path:
    """Builds (or finds cached) MinIO; returns its path. The script's progress goes to this
    process's stderr."""
    return hack_output("build-minio.sh")


class Minio(serverproc.Server):
    """One MinIO server; ``endpoint`` is its S3 URL."""

    LOG_FILE = LOG_FILE
    STOP_GRACE_S = 10

    def __init__(self, state_dir: Path, bucket: str = BUCKET) -> None:
        super().__init__(state_dir)
        self.bucket = bucket
        self.access_key = "tr" + secrets.token_hex(8)
        self.secret_key = secrets.token_urlsafe(30)

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
        self.proc = serverproc.spawn(args, self.log_path, env)
        try:
            url = f"{self.endpoint}/minio/health/ready"
            serverproc.wait_ready(self.proc, url, "minio", self.log_path, READY_TIMEOUT_S)
            self.client().create_bucket(Bucket=self.bucket)
        except BaseException:
            self.stop()
            raise
        return self
