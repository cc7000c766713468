"""``trainingrun sync`` as a real process against a private SeaweedFS (no control plane): what
happens around its start-up and when its credentials stop working.

Covers:

- SIGTERM while the sidecar is still starting (held in its import of boto3 by a
  ``sitecustomize`` hook, as a slow node holds it): the complete checkpoint waiting on disk is
  committed and the process exits 0, not 143;
- credentials that are refused (a rotated or revoked key): after
  ``TRAININGRUN_ACCESS_DENIED_SECONDS`` of nothing but access denied the sidecar exits 1, its
  termination message saying that checkpoints are not being committed, without the secret.

Both need ``trainingrun sync`` (cli.py) to install ``trainingrun.agent.stopsignal`` first thing and
to
read the sidecar's new settings from its environment: strict xfail until it does, so that the
wiring shows up as an unexpected pass to remove the marker.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.agents import (
    S3,
    SyncProcess,
    agent_env,
    make_checkpoint,
    manifest_of,
    start_sync,
)
from tests.integration.support import wait_for
from trainingrun.decide.protection import ACCESS_DENIED_MESSAGE

MiB = 1 << 20

# Holds the process in its first import of boto3 (after trainingrun.cli is imported, before the
# S3 client exists) and says so in a file, so the test's SIGTERM lands in the start-up.
SLOW_START = textwrap.dedent(
    """
    import importlib.abc, os, sys, time

    class _SlowBoto3(importlib.abc.MetaPathFinder):
        held = False

        def find_spec(self, name, path=None, target=None):
            if name == "boto3" and not self.held:
                self.held = True
                with open(os.environ["SLOW_START_MARK"], "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(float(os.environ["SLOW_START_SECONDS"]))
            return None

    sys.meta_path.insert(0, _SlowBoto3())
    """
)


def test_sigterm_during_start_up_still_commits_the_waiting_checkpoint(
    seaweedfs: S3, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    ckdir = tmp_path / "ck"
    make_checkpoint(ckdir, 30, {"model.safetensors": 20 * MiB, "config.json": 700})
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_START)
    mark = tmp_path / "slow-start"
    env = agent_env(
        seaweedfs,
        f"s3://{seaweedfs.bucket}/startup",
        ckdir,
        PYTHONPATH=os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
        SLOW_START_MARK=str(mark),
        SLOW_START_SECONDS="3",
        TRAININGRUN_EPOCH="1",
        TRAININGRUN_QUIET_SECONDS="600",  # only the drain may upload it
    )
    proc = start_sync(syncs, env, tmp_path)
    wait_for(mark.exists, 60, "the sidecar held in its start-up")

    code = proc.terminate(timeout=120)

    assert code == 0, proc.log()
    manifest = manifest_of(seaweedfs.client(), seaweedfs.bucket, "startup")
    assert manifest is not None and manifest["latest"] == 30, proc.log()


def test_refused_credentials_end_the_sidecar_with_a_termination_message(
    seaweedfs: S3, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    revoked = S3(seaweedfs.endpoint, seaweedfs.access_key, "revoked-secret", seaweedfs.region)
    message_file = tmp_path / "termination-log"
    env = agent_env(
        revoked,
        f"s3://{seaweedfs.bucket}/denied",
        tmp_path / "ck",
        TRAININGRUN_ACCESS_DENIED_SECONDS="5",
        TRAININGRUN_TERMINATION_LOG=str(message_file),
    )
    proc = start_sync(syncs, env, tmp_path)
    started = time.monotonic()
    try:
        code = proc.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the sidecar kept retrying access denied past its limit")

    assert code == 1
    assert time.monotonic() - started >= 5
    message = message_file.read_text()
    assert message.startswith(ACCESS_DENIED_MESSAGE)
    assert "revoked-secret" not in message and "revoked-secret" not in proc.log()
    assert ACCESS_DENIED_MESSAGE in proc.log()
