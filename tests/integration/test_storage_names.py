"""A bucket and keys whose names contain "bucket", against the real SeaweedFS S3 server.

A regression: a missing object used to be told from a missing bucket by the word "bucket" in the
error text, which names the bucket and the key, so in ``my-bucket-…`` every read of an object
not there yet raised and ``trainingrun sync`` never committed.

Covers, in a fresh bucket ``my-bucket-<random>`` under ``bucket-runs/``:

- Store.get(), get_with_etag() and head() of a missing manifest.json give None; a bucket that
  does not exist raises BucketNotFound;
- a ``trainingrun sync`` process commits a checkpoint there (manifest.json appears with the
  step), and the operator's choice of a checkpoint to resume from finds it intact.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import localenv as localenv_mod
from tests.integration.agents import S3, SyncProcess, agent_env, make_checkpoint, wait_committed
from trainingrun.checkpoint.lookup import choose_checkpoint
from trainingrun.checkpoint.manifest import RUN_MANIFEST
from trainingrun.storage.opener import (
    BucketNotFound,
    Credentials,
    Location,
    S3Store,
    Store,
    make_client,
)

MiB = 1 << 20


@pytest.fixture
def named_bucket(bucket_env: localenv_mod.LocalEnv, s3: Any) -> Iterator[str]:
    """A new bucket with "bucket" in its name, emptied and removed afterwards."""
    name = f"my-bucket-{uuid.uuid4().hex[:8]}"
    localenv_mod.ensure_bucket(dataclasses.replace(bucket_env, bucket=name))
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        objects = [{"Key": o["Key"]} for o in page.get("Contents") or []]
        if objects:
            s3.delete_objects(Bucket=name, Delete={"Objects": objects})
    s3.delete_bucket(Bucket=name)


def _store(bucket_env: localenv_mod.LocalEnv, bucket: str) -> Store:
    creds = Credentials(bucket_env.s3_access_key, bucket_env.s3_secret_key)
    return S3Store(make_client(bucket_env.s3_endpoint, bucket_env.s3_region, creds), bucket)


def test_missing_objects_read_as_none_in_a_bucket_named_bucket(
    bucket_env: localenv_mod.LocalEnv, named_bucket: str
) -> None:
    store = _store(bucket_env, named_bucket)
    key = Location(named_bucket, f"bucket-runs/{uuid.uuid4().hex[:8]}").key(RUN_MANIFEST)

    assert store.get(key) is None
    assert store.get_with_etag(key) is None
    assert store.head(key) is None
    with pytest.raises(BucketNotFound, match="does not exist: create it first"):
        _store(bucket_env, f"no-such-bucket-{uuid.uuid4().hex[:8]}").get(key)


def test_sync_commits_into_a_bucket_named_bucket(
    bucket_env: localenv_mod.LocalEnv, s3: Any, named_bucket: str, tmp_path: Path
) -> None:
    run_key = f"bucket-runs/{uuid.uuid4().hex[:8]}"
    ckdir = tmp_path / "ck"
    make_checkpoint(ckdir, 10, {"model.safetensors": 2 * MiB, "optimizer.pt": 3000})
    env = agent_env(
        dataclasses.replace(S3.of(bucket_env), bucket=named_bucket),
        f"s3://{named_bucket}/{run_key}",
        ckdir,
    )
    proc = SyncProcess(env, tmp_path / "sync.log")
    try:
        manifest = wait_committed(s3, named_bucket, run_key, 10, timeout=120)
        assert proc.terminate() == 0, proc.log()
    finally:
        proc.close()

    assert manifest["latest"] == 10
    assert "checkpoint-10 committed" in proc.log()
    choice = choose_checkpoint(
        _store(bucket_env, named_bucket), Location(named_bucket, run_key), set()
    )
    assert choice.entry is not None
    assert choice.entry.step == 10
    assert choice.rejected == []
