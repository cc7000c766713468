"""Every trainer's checkpoint layout through the real ``trainingrun sync`` and ``trainingrun
restore`` processes against SeaweedFS.

Covers, for each format of tests/trainer_layouts.py (saves laid out as the framework's source
writes them):

- auto-detection: the sync log names the format; two saves are committed with the layout
  (format, folder, resume path, pointer files) in manifest.json; the restore into an empty
  folder puts back every file bit for bit plus the framework's pointer file naming the restored
  checkpoint, and says what the trainer resumes from;
- a save killed half-way, then SIGTERM (the pod ending): the drain never commits it, the older
  whole save stays the newest committed;
- a folder matching no format: the sync log names the files and commits nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agents import (
    S3,
    SyncProcess,
    agent_env,
    manifest_of,
    run_restore,
    start_sync,
    wait_committed,
    wait_log,
)
from tests.trainer_layouts import SAVES, Save, apply

FORMATS = [f for f in SAVES if f != "hf"]  # the HF Trainer's: tests/integration/test_sync_restore


@dataclass
class Started:
    """A sync watching a folder that holds a format's first save, committed; the second save
    is the test's to write."""

    client: Any
    uri: str
    ckdir: Path
    proc: SyncProcess
    first: Save
    second: Save


def first_committed(
    agent_s3: S3,
    run_key: str,
    tmp_path: Path,
    syncs: list[SyncProcess],
    fmt: str,
    **env: str,
) -> Started:
    """The first save written long ago (whole by any rule), a sync started, the save
    committed."""
    client = agent_s3.client()
    uri = f"s3://{agent_s3.bucket}/{run_key}"
    ckdir = tmp_path / "ck"
    first, second = SAVES[fmt](10), SAVES[fmt](20)
    apply(ckdir, first.ops, mtime=time.time() - 60)
    proc = start_sync(syncs, agent_env(agent_s3, uri, ckdir, **env), tmp_path)
    wait_committed(client, agent_s3.bucket, run_key, first.step, timeout=90)
    return Started(client, uri, ckdir, proc, first, second)


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_committed_and_restored_where_the_trainer_looks(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess], fmt: str
) -> None:
    run = first_committed(agent_s3, run_key, tmp_path, syncs, fmt)
    client, uri, proc, second = run.client, run.uri, run.proc, run.second
    apply(run.ckdir, second.ops)
    manifest = wait_committed(client, agent_s3.bucket, run_key, second.step, timeout=60)
    assert proc.terminate() == 0
    assert f"checkpoint format recognised: {fmt}" in proc.log()
    assert "match no checkpoint format" not in proc.log()
    entry = next(e for e in manifest["entries"] if e["step"] == second.step)
    assert entry["layout"]["format"] == fmt
    assert entry["layout"]["resume"] == second.resume
    base = entry["layout"]["base"]
    extras = {(f"{base}/" if base else "") + p: t for p, t in entry["layout"]["extras"].items()}
    assert extras == second.extras

    restored = tmp_path / "restored"
    result = run_restore(
        agent_env(agent_s3, uri, restored, TRAININGRUN_RESTORE_STEP=str(second.step))
    )
    assert result.returncode == 0, result.stderr
    assert f"the trainer resumes from {restored / second.resume}" in result.stderr
    files = {p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()}
    assert files == set(second.restored)
    for path, blob in second.restored.items():
        assert (restored / path).read_bytes() == blob, path


@pytest.mark.parametrize("fmt", FORMATS)
def test_save_killed_half_way_is_never_committed(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess], fmt: str
) -> None:
    run = first_committed(agent_s3, run_key, tmp_path, syncs, fmt, TRAININGRUN_QUIET_SECONDS="30")
    # Killed in the middle of its last file (or before its marker): then the pod ends.
    *done, (op, path, blob) = run.second.ops
    cut = [("write", path, blob[: len(blob) // 2])] if isinstance(blob, bytes) else []
    apply(run.ckdir, [*done, *cut] if op == "write" else done)
    assert run.proc.terminate(timeout=90) == 0

    manifest = manifest_of(run.client, agent_s3.bucket, run_key)
    assert manifest is not None
    assert [e["step"] for e in manifest["entries"]] == [run.first.step]


def test_unknown_layout_is_named_in_the_log_and_not_committed(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    client = agent_s3.client()
    ckdir = tmp_path / "ck"
    apply(ckdir, [("write", f"weights/shard-{i}.bin", b"w" * 100) for i in range(7)])
    env = agent_env(agent_s3, f"s3://{agent_s3.bucket}/{run_key}", ckdir)
    proc = start_sync(syncs, env, tmp_path)

    wait_log(proc, "7 files in", timeout=60)
    assert proc.terminate() == 0
    assert "weights/shard-0.bin, weights/shard-1.bin" in proc.log()
    assert "and 2 more" in proc.log()
    listing = client.list_objects_v2(Bucket=agent_s3.bucket, Prefix=f"{run_key}/checkpoints/")
    assert listing.get("KeyCount", 0) == 0
