"""The fenced, rank-aware commit protocol with real ``trainingrun sync`` and ``trainingrun
restore`` processes against SeaweedFS.

- Two ranks: the parts of attempt N and N-1 in the bucket never commit together, and a step
  with a rank's part missing stays uncommitted; once both ranks of one attempt wrote theirs,
  the step is committed once, the older attempt's leftover part is swept, and a restore puts
  both ranks' files in one folder, bit for bit.

The upgrade of a version-1 bucket runs on every store in test_stores.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.agents import (
    S3,
    SyncProcess,
    agent_env,
    make_checkpoint,
    run_restore,
    wait_committed,
    wait_log,
)
from tests.integration.support import wait_for
from trainingrun.checkpoint.commit import take_fence
from trainingrun.storage.opener import Credentials, Location, S3Store, Store, make_client

MiB = 1 << 20


def _store(agent_s3: S3) -> Store:
    client = make_client(
        agent_s3.endpoint, agent_s3.region, Credentials(agent_s3.access_key, agent_s3.secret_key)
    )
    return S3Store(client, agent_s3.bucket)


def _manifest(agent_s3: S3, run_key: str) -> dict[str, Any]:
    body = agent_s3.client().get_object(Bucket=agent_s3.bucket, Key=f"{run_key}/manifest.json")[
        "Body"
    ]
    manifest: dict[str, Any] = json.loads(body.read())
    return manifest


def _keys(agent_s3: S3, prefix: str) -> list[str]:
    pages = (
        agent_s3.client()
        .get_paginator("list_objects_v2")
        .paginate(Bucket=agent_s3.bucket, Prefix=prefix)
    )
    return [o["Key"] for page in pages for o in page.get("Contents") or []]


def _rank(
    agent_s3: S3,
    syncs: list[SyncProcess],
    tmp_path: Path,
    uri: str,
    epoch: int,
    rank: int,
    step: int,
) -> tuple[SyncProcess, Path]:
    """One rank's sidecar of one epoch, with that rank's files of ``step`` saved."""
    ckdir = tmp_path / f"e{epoch}r{rank}"
    files = {f"shard-{rank}.bin": 3 * MiB + rank, "config.json": 300}
    make_checkpoint(ckdir, step, files, seed=epoch * 100 + rank)
    # config.json is the same on every rank of an epoch, as a model config is.
    (ckdir / f"checkpoint-{step}" / "config.json").write_text(f'{{"epoch": {epoch}}}')
    env = agent_env(
        agent_s3,
        uri,
        ckdir,
        TRAININGRUN_EPOCH=str(epoch),
        TRAININGRUN_ATTEMPT=str(epoch),
        TRAININGRUN_RANK=str(rank),
        TRAININGRUN_RANKS="2",
    )
    proc = SyncProcess(env, tmp_path / f"sync-e{epoch}r{rank}.log")
    syncs.append(proc)
    return proc, ckdir / f"checkpoint-{step}"


def test_parts_of_two_attempts_never_commit_together(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    uri = f"s3://{agent_s3.bucket}/{run_key}"
    run = Location(agent_s3.bucket, run_key)
    store = _store(agent_s3)
    _, epoch1 = take_fence(store, run, "uid", 1)

    old, _ = _rank(agent_s3, syncs, tmp_path, uri, epoch1, 1, 10)
    wait_log(old, "waiting for ranks [0]", timeout=60)
    assert old.terminate() == 0
    assert _keys(agent_s3, f"{run_key}/checkpoints/checkpoint-10/e{epoch1}/r1/")

    _, epoch2 = take_fence(store, run, "uid", 2)
    first, _ = _rank(agent_s3, syncs, tmp_path, uri, epoch2, 0, 10)
    wait_log(first, "waiting for ranks [1]", timeout=60)
    # Rank 0 of epoch 2 and rank 1 of epoch 1 together would be a whole checkpoint: not one.
    assert _manifest(agent_s3, run_key)["entries"] == []

    second, _ = _rank(agent_s3, syncs, tmp_path, uri, epoch2, 1, 10)
    manifest = wait_committed(agent_s3.client(), agent_s3.bucket, run_key, 10, timeout=60)
    [entry] = manifest["entries"]
    assert (entry["epoch"], entry["ranks"], entry["attempt"]) == (epoch2, 2, 2)
    assert manifest["fence"] == epoch2
    # The old attempt's part is nobody's: the committer sweeps it.
    wait_for(
        lambda: not _keys(agent_s3, f"{run_key}/checkpoints/checkpoint-10/e{epoch1}/"),
        30,
        "epoch 1's leftover part deleted",
    )
    for proc in (first, second):
        assert proc.terminate() == 0

    restored = tmp_path / "restored"
    result = run_restore(agent_env(agent_s3, uri, restored, TRAININGRUN_RESTORE_STEP="10"))
    assert result.returncode == 0, result.stderr
    folder = restored / "checkpoint-10"
    for rank in range(2):
        src = tmp_path / f"e{epoch2}r{rank}" / "checkpoint-10" / f"shard-{rank}.bin"
        assert (folder / f"shard-{rank}.bin").read_bytes() == src.read_bytes()
    assert json.loads((folder / "config.json").read_text()) == {"epoch": epoch2}


def test_a_stale_writer_uploading_across_the_fence_move_commits_nothing(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    """An attempt's sidecar is mid-upload when the operator takes the fence for the next
    attempt: its upload goes on (its keys are its own), its commit is refused, and the next
    attempt's commit of the same step sweeps what it left."""
    uri = f"s3://{agent_s3.bucket}/{run_key}"
    run = Location(agent_s3.bucket, run_key)
    store = _store(agent_s3)
    _, epoch1 = take_fence(store, run, "uid", 1)
    old_dir = tmp_path / "old"
    make_checkpoint(old_dir, 50, {"model.safetensors": 30 * MiB}, seed=1)
    # Six parts of 5 MiB at 2 MiB/s: the throttle holds every part after the first for 2.5 s,
    # so the upload is still going for about 12 s after it starts.
    env = agent_env(
        agent_s3,
        uri,
        old_dir,
        TRAININGRUN_EPOCH=str(epoch1),
        TRAININGRUN_MAX_BANDWIDTH_MBPS="2",
        TRAININGRUN_PART_SIZE_MB="5",
    )
    old = SyncProcess(env, tmp_path / "old.log")
    syncs.append(old)
    wait_log(old, "checkpoint-50: uploading", timeout=60)

    _, epoch2 = take_fence(store, run, "uid", 2)  # the old upload has ~12 s to go
    wait_log(old, f"epoch {epoch1} is fenced", timeout=60)
    assert "checkpoint-50: uploaded and verified" in old.log(), "the upload went on to its end"
    assert _manifest(agent_s3, run_key)["entries"] == []
    assert _keys(agent_s3, f"{run_key}/checkpoints/checkpoint-50/e{epoch1}/")

    new_dir = tmp_path / "new"
    src = make_checkpoint(new_dir, 50, {"model.safetensors": 2 * MiB}, seed=2)
    new = SyncProcess(
        agent_env(agent_s3, uri, new_dir, TRAININGRUN_EPOCH=str(epoch2)), tmp_path / "new.log"
    )
    syncs.append(new)
    manifest = wait_committed(agent_s3.client(), agent_s3.bucket, run_key, 50, timeout=60)
    assert [(e["step"], e["epoch"]) for e in manifest["entries"]] == [(50, epoch2)]
    assert not _keys(agent_s3, f"{run_key}/checkpoints/checkpoint-50/e{epoch1}/"), "swept"
    for proc in (old, new):
        assert proc.terminate() == 0
    restored = tmp_path / "restored"
    result = run_restore(agent_env(agent_s3, uri, restored, TRAININGRUN_RESTORE_STEP="50"))
    assert result.returncode == 0, result.stderr
    assert (restored / "checkpoint-50" / "model.safetensors").read_bytes() == (
        src / "model.safetensors"
    ).read_bytes()
