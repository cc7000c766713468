"""A gang whose ranks write the same small files, with real ``trainingrun sync`` and
``trainingrun restore`` processes against SeaweedFS (the session's own, ``seaweedfs``).

- Two ranks of one attempt each save a checkpoint holding ``config.json`` with the same bytes
  (as ``save_on_each_node`` writes it), ``trainer_state.json`` (the same too), a small shard of
  their own and a large file of their own. Each rank's small files travel in one pack, so rank
  1's pack holds copies of the shared files that the restore does not download. The step is
  committed by the ranks' sidecars, and the restore puts every file in one folder, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.agents import (
    S3,
    SyncProcess,
    agent_env,
    make_checkpoint,
    run_restore,
    wait_committed,
)
from trainingrun.checkpoint import local
from trainingrun.checkpoint.commit import take_fence
from trainingrun.checkpoint.manifest import PACK_DIR
from trainingrun.storage.opener import Credentials, Location, S3Store, make_client

MiB = 1 << 20
STEP = 10
CONFIG = b'{"a":1}'  # the same on both ranks: sorted first in each rank's pack


def _rank(
    agent_s3: S3, syncs: list[SyncProcess], tmp_path: Path, uri: str, epoch: int, rank: int
) -> Path:
    """One rank's sidecar with that rank's checkpoint saved; returns the checkpoint's folder."""
    root = tmp_path / f"r{rank}"
    sizes = {f"shard-{rank}.bin": 200, f"model-{rank}.safetensors": 2 * MiB}
    folder = make_checkpoint(root, STEP, sizes, marked=False, seed=rank)
    (folder / "config.json").write_bytes(CONFIG)
    local.mark_complete(folder)
    env = agent_env(
        agent_s3,
        uri,
        root,
        TRAININGRUN_EPOCH=str(epoch),
        TRAININGRUN_ATTEMPT="1",
        TRAININGRUN_RANK=str(rank),
        TRAININGRUN_RANKS="2",
    )
    proc = SyncProcess(env, tmp_path / f"sync-r{rank}.log")
    syncs.append(proc)
    return folder


def test_a_gang_with_a_file_on_every_rank_restores_bit_for_bit(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    uri = f"s3://{agent_s3.bucket}/{run_key}"
    store = S3Store(
        make_client(
            agent_s3.endpoint,
            agent_s3.region,
            Credentials(agent_s3.access_key, agent_s3.secret_key),
        ),
        agent_s3.bucket,
    )
    _, epoch = take_fence(store, Location(agent_s3.bucket, run_key), "uid", 1)
    saved = [_rank(agent_s3, syncs, tmp_path, uri, epoch, rank) for rank in range(2)]

    wait_committed(agent_s3.client(), agent_s3.bucket, run_key, STEP, timeout=90)
    for proc in syncs:
        assert proc.terminate() == 0
    # Each rank's small files (config.json, its shard, trainer_state.json) went as one pack.
    listing = agent_s3.client().list_objects_v2(Bucket=agent_s3.bucket, Prefix=f"{run_key}/")
    keys = [o["Key"] for o in listing.get("Contents") or []]
    for rank in range(2):
        assert f"{run_key}/checkpoints/checkpoint-{STEP}/e{epoch}/r{rank}/{PACK_DIR}/0" in keys

    restored = tmp_path / "restored"
    result = run_restore(agent_env(agent_s3, uri, restored, TRAININGRUN_RESTORE_STEP=str(STEP)))

    assert result.returncode == 0, result.stderr
    folder = restored / f"checkpoint-{STEP}"
    expected = {
        p.relative_to(src).as_posix(): p.read_bytes()
        for src in saved
        for p in src.rglob("*")
        if p.is_file() and p.name != local.COMPLETE_MARKER
    }
    got = {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != local.COMPLETE_MARKER
    }
    assert sorted(got) == sorted(expected)
    assert all(got[name] == data for name, data in expected.items())
