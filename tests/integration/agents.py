"""Helpers for tests of ``trainingrun sync`` and ``trainingrun restore`` as real processes
against SeaweedFS: their environment, synthetic checkpoints, and a private SeaweedFS that a test
may stop and start again on the same ports (the shared one is never disturbed)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import localenv
from tests.integration.stores import Bucket
from tests.integration.support import wait_for
from trainingrun.checkpoint import local
from trainingrun.contract import checkpoint_dirname

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class S3:
    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    bucket: str = "trainingrun"

    @classmethod
    def of(cls, env: localenv.LocalEnv) -> S3:
        return cls(env.s3_endpoint, env.s3_access_key, env.s3_secret_key, env.s3_region, env.bucket)

    def client(self) -> Any:
        return localenv.s3_client(self.as_localenv())

    def as_localenv(self) -> localenv.LocalEnv:
        return localenv.LocalEnv(
            name="private",
            kubeconfig="",
            bin_dir="",
            s3_endpoint=self.endpoint,
            s3_access_key=self.access_key,
            s3_secret_key=self.secret_key,
            s3_region=self.region,
            bucket=self.bucket,
            seaweedfs_pid=0,
        )


class PrivateSeaweedFS:
    """A SeaweedFS of one test, on loopback; ``stop()`` and ``start()`` keep ports and data."""

    def __init__(self, sdir: Path) -> None:
        self.sdir = sdir
        sdir.mkdir(parents=True, exist_ok=True)
        self.ports = localenv.free_ports(localenv.SEAWEEDFS_PORTS)
        self.s3 = S3(
            endpoint=f"http://127.0.0.1:{self.ports[6]}",
            access_key="tr" + secrets.token_hex(8),
            secret_key=secrets.token_urlsafe(30),
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc, endpoint = localenv.seaweedfs_process(
            self.sdir, self.ports, self.s3.access_key, self.s3.secret_key
        )
        assert endpoint == self.s3.endpoint
        env = dataclasses.replace(self.s3.as_localenv(), seaweedfs_pid=self.proc.pid)
        try:
            localenv.wait_s3(env, self.sdir)
            localenv.ensure_bucket(env)
        except BaseException:
            self.stop()
            raise

    def stop(self, keep_data: bool = True) -> None:
        """Stops the server; ``keep_data=False`` when its folder goes next (killed at once)."""
        if self.proc is not None:
            localenv.stop_seaweedfs(self.proc.pid, keep_data)
            self.proc.wait(timeout=localenv.SEAWEEDFS_STOP_S + 15)
            self.proc = None


def agent_env(s3: S3, uri: str, checkpoint_dir: Path, **extra: str) -> dict[str, str]:
    """The environment the operator gives sync and restore, with credentials as the
    secretKeyRef would put them, and metrics off (tests run many at once)."""
    return Bucket.seaweedfs(s3.as_localenv()).env(uri, checkpoint_dir, **extra)


def make_checkpoint(
    root: Path, step: int, sizes: dict[str, int], marked: bool = True, seed: int | None = None
) -> Path:
    """A checkpoint folder shaped like a Trainer's: the given files with pseudo-random bytes,
    ``trainer_state.json`` written last, then the completion marker."""
    folder = root / checkpoint_dirname(step)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed if seed is not None else step)
    for name, size in sizes.items():
        with (folder / name).open("wb") as f:
            left = size
            while left:
                n = min(left, 1 << 20)
                f.write(rng.randbytes(n))
                left -= n
    (folder / local.TRAINER_STATE).write_text(f'{{"global_step": {step}}}')
    if marked:
        local.mark_complete(folder)
    return folder


class SyncProcess:
    """``trainingrun sync`` as a child process with its log in a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / "trainingrun"), "sync"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._log.close()


def start_sync(syncs: list[SyncProcess], env: dict[str, str], tmp_path: Path) -> SyncProcess:
    """A sync process with its log in ``tmp_path``; ``syncs`` (the fixture) stops it at the end."""
    proc = SyncProcess(env, tmp_path / f"sync-{len(syncs)}.log")
    syncs.append(proc)
    return proc


def run_restore(env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "trainingrun"), "restore"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def manifest_of(client: Any, bucket: str, run_key: str) -> dict[str, Any] | None:
    """The run's manifest.json as JSON; None while there is none."""
    try:
        body = client.get_object(Bucket=bucket, Key=f"{run_key}/manifest.json")["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    return dict(json.loads(body))


def wait_committed(
    client: Any, bucket: str, run_key: str, step: int, timeout: float
) -> dict[str, Any]:
    """Waits until ``step`` is in the run's manifest.json; returns the manifest."""

    def committed() -> dict[str, Any] | None:
        manifest = manifest_of(client, bucket, run_key)
        if manifest is None or not any(e["step"] == step for e in manifest["entries"]):
            return None
        return manifest

    return wait_for(committed, timeout, f"checkpoint-{step} committed under {run_key}")


def wait_log(proc: SyncProcess, text: str, timeout: float) -> None:
    wait_for(lambda: text in proc.log(), timeout, f"{text!r} in the sync log")
