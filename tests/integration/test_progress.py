"""The trainer's progress from its file to the operator's read, against a private SeaweedFS (no
control plane): ``trainingrun sync`` as a real process publishes the progress record into the
run's prefix, and the operator's ``RunStores.read_progress`` reads it back with the run's own
credentials.

Covers:

- rank 0's sidecar puts ``<run prefix>/progress.json`` soon after the trainer writes its
  progress file, with the step, the total, the attempt and the first step seen; the operator
  reads the same record, and ``decide.progress.shown`` makes the status figures of it;
- a record over its cap in the bucket is refused by the operator's read (display only).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.integration.agents import S3, SyncProcess, agent_env, start_sync
from tests.integration.support import wait_for
from tests.unit.builders import make_run
from trainingrun.checkpoint import local
from trainingrun.checkpoint.progress import PROGRESS_RECORD, ProgressError, decode
from trainingrun.decide.naming import RunRef, run_prefix
from trainingrun.decide.progress import shown
from trainingrun.operator.buckets import RunStores
from trainingrun.storage.opener import parse_uri


class Secrets:
    """The run's credentials Secret, as the operator's API client would return it."""

    def __init__(self, s3: S3) -> None:
        self.data = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return dict(self.data)


def run_ref(s3: S3) -> RunRef:
    uri = f"s3://{s3.bucket}/progress-{uuid.uuid4().hex[:8]}"
    builder = make_run("r1").with_storage(
        uri=uri, endpoint=s3.endpoint, region=s3.region, credentials_secret="creds"
    )
    return builder.ref()


def test_the_sidecar_publishes_and_the_operator_reads_progress(
    agent_s3: S3, syncs: list[SyncProcess], tmp_path: Path
) -> None:
    ref = run_ref(agent_s3)
    ckdir = tmp_path / "ck"
    env = agent_env(agent_s3, run_prefix(ref), ckdir, TRAININGRUN_ATTEMPT="2")
    local.write_progress(ckdir, local.Progress(120, 1000, samples_per_second=64.0))
    sync = start_sync(syncs, env, tmp_path)
    stores = RunStores(Secrets(agent_s3), 30.0)

    record = wait_for(lambda: stores.read_progress(ref), timeout_s=30, what="a progress record")

    assert (record.step, record.total_steps, record.attempt) == (120, 1000, 2)
    assert (record.first_step, record.samples_per_second) == (120, 64.0)
    status = shown(record, attempt=2, now=datetime.now(UTC))
    assert (status.summary, status.step) == ("12%", 120)
    assert sync.terminate() == 0


def test_a_record_over_its_cap_is_refused_by_the_operator(agent_s3: S3) -> None:
    ref = run_ref(agent_s3)
    stores = RunStores(Secrets(agent_s3), 30.0)
    store = stores.store_for(ref.namespace, ref.spec.checkpoint.storage)
    store.put(parse_uri(run_prefix(ref)).key(PROGRESS_RECORD), b'{"step": 1' + b" " * 10_000 + b"}")

    with pytest.raises(ProgressError, match="over 4096 bytes"):
        stores.read_progress(ref)
    with pytest.raises(ProgressError):
        decode(b"{}")
