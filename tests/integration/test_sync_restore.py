"""``trainingrun sync`` and ``trainingrun restore`` as real processes against SeaweedFS.

Covers: a checkpoint committed and restored bit for bit; completion by marker and by quiet period,
non-checkpoints ignored; retention; the endpoint down during an upload (until the sidecar has
failed two passes on it); a file that changes while uploading; a name escaping the folder; a
malformed or future manifest left untouched; SIGTERM drains the newest checkpoint; a preemption
notice becomes a save request; wrong credentials and a missing bucket give clear errors. The cases
every store runs (SIGKILL mid-upload, two writers, a corrupted object) are in test_stores.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agents import (
    S3,
    PrivateSeaweedFS,
    SyncProcess,
    agent_env,
    make_checkpoint,
    manifest_of,
    run_restore,
    start_sync,
    wait_committed,
    wait_log,
)
from tests.integration.support import wait_for
from tests.localenv import free_ports
from trainingrun.checkpoint import local
from trainingrun.checkpoint.manifest import PACK_DIR
from trainingrun.contract import ANNOTATION_NOTICE, EXIT_CHECKPOINT_BAD
from trainingrun.storage.s3.store import READ_BLOCK, S3Store, socket_reader

MiB = 1 << 20
HF_LIKE = {
    "model.safetensors": 40 * MiB,
    "optimizer.pt": 70 * MiB,
    "scheduler.pt": 1500,
    "rng_state.pth": 14000,
    "training_args.bin": 5000,
    "config.json": 700,
}


def keys_under(client: Any, bucket: str, prefix: str) -> list[str]:
    resp = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in resp.get("Contents") or []]


def entry_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.name != local.COMPLETE_MARKER)


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(
        p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != local.COMPLETE_MARKER
    )
    files_b = sorted(
        p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name != local.COMPLETE_MARKER
    )
    return files_a == files_b and all((a / f).read_bytes() == (b / f).read_bytes() for f in files_a)


def test_checkpoint_committed_then_restored_bit_for_bit(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    client = agent_s3.client()
    ckdir = tmp_path / "ck"
    src = make_checkpoint(ckdir, 10, HF_LIKE)
    (port,) = free_ports(1)
    env = agent_env(
        agent_s3,
        f"s3://{agent_s3.bucket}/{run_key}",
        ckdir,
        TRAININGRUN_METRICS_PORT=str(port),
        TRAININGRUN_METRICS_ADDRESS="127.0.0.1",
    )
    proc = start_sync(syncs, env, tmp_path)
    manifest = wait_committed(client, agent_s3.bucket, run_key, 10, timeout=120)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    metrics = {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name and not name.startswith("#")
    }
    assert metrics["trainingrun_sync_last_committed_step"] == 10
    assert metrics["trainingrun_sync_uploaded_bytes_total"] == entry_bytes(src)
    assert metrics["trainingrun_sync_committed_checkpoints_total"] == 1
    assert manifest["latest"] == 10
    entry = manifest["entries"][0]
    assert entry["files"] == len(HF_LIKE) + 1  # + trainer_state.json; the marker is not uploaded
    assert entry["bytes"] == sum(HF_LIKE.values()) + (src / local.TRAINER_STATE).stat().st_size
    ckpt = json.loads(
        client.get_object(
            Bucket=agent_s3.bucket, Key=f"{run_key}/checkpoints/checkpoint-10/e1/r0/MANIFEST.json"
        )["Body"].read()
    )
    assert {f["checksum_algorithm"] for f in ckpt["files"]} == {"CRC64NVME"}
    # The small files went up in one pack, the two large ones on their own.
    assert ckpt["version"] == 3
    packed = {f["path"] for f in ckpt["files"] if f["pack"] == PACK_DIR + "/0"}
    assert packed == {name for name, size in HF_LIKE.items() if size < MiB} | {local.TRAINER_STATE}
    part = f"{run_key}/checkpoints/checkpoint-10/e1/r0/"
    assert sorted(k[len(part) :] for k in keys_under(client, agent_s3.bucket, part)) == [
        f"{PACK_DIR}/0",
        "MANIFEST.json",
        "model.safetensors",
        "optimizer.pt",
    ]
    assert local.COMPLETE_MARKER not in {f["path"] for f in ckpt["files"]}
    # The upload time the operator's save estimate is made of: the part's, and the entry's.
    assert 0 < ckpt["upload_seconds"] < 120
    assert entry["upload_seconds"] == ckpt["upload_seconds"]
    assert proc.terminate() == 0
    assert "checkpoint-10 committed" in proc.log()

    restored = tmp_path / "restored"
    result = run_restore(
        agent_env(
            agent_s3, f"s3://{agent_s3.bucket}/{run_key}", restored, TRAININGRUN_RESTORE_STEP="10"
        )
    )
    assert result.returncode == 0, result.stderr
    assert "restored and verified" in result.stderr
    assert same_tree(src, restored / "checkpoint-10")
    assert (restored / "checkpoint-10" / local.COMPLETE_MARKER).exists()
    # The trainer may run as another user than the agent: it must be able to rotate it away.
    tree = [restored / "checkpoint-10", *(restored / "checkpoint-10").rglob("*")]
    assert {p.stat().st_mode & 0o777 for p in tree if p.is_dir()} == {0o777}
    assert {p.stat().st_mode & 0o777 for p in tree if p.is_file()} == {0o666}


def test_quiet_period_completes_unmarked_and_ignores_non_checkpoints(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    client = agent_s3.client()
    ckdir = tmp_path / "ck"
    make_checkpoint(ckdir, 5, {"weights.bin": 2 * MiB}, marked=False)
    not_a_checkpoint = ckdir / "checkpoint-6"  # no trainer_state.json: never complete
    not_a_checkpoint.mkdir(parents=True)
    (not_a_checkpoint / "partial.bin").write_bytes(b"x" * 1000)
    (ckdir / "runs").mkdir()
    (ckdir / "runs" / "events.log").write_text("not a checkpoint folder")
    start_sync(syncs, agent_env(agent_s3, f"s3://{agent_s3.bucket}/{run_key}", ckdir), tmp_path)
    wait_committed(client, agent_s3.bucket, run_key, 5, timeout=60)
    make_checkpoint(ckdir, 7, {"weights.bin": MiB})
    manifest = wait_committed(client, agent_s3.bucket, run_key, 7, timeout=60)
    assert sorted(e["step"] for e in manifest["entries"]) == [5, 7]
    assert keys_under(client, agent_s3.bucket, f"{run_key}/checkpoints/checkpoint-6/") == []
    assert not [k for k in keys_under(client, agent_s3.bucket, run_key) if "runs/" in k]


def test_retention_keeps_newest_and_deletes_dropped_objects(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    client = agent_s3.client()
    ckdir = tmp_path / "ck"
    start_sync(
        syncs,
        agent_env(agent_s3, f"s3://{agent_s3.bucket}/{run_key}", ckdir, TRAININGRUN_KEEP="2"),
        tmp_path,
    )
    for step in (10, 20, 30):
        make_checkpoint(ckdir, step, {"weights.bin": MiB})
        wait_committed(client, agent_s3.bucket, run_key, step, timeout=60)
    manifest = manifest_of(client, agent_s3.bucket, run_key)
    assert manifest is not None
    assert [e["step"] for e in manifest["entries"]] == [20, 30]
    wait_for(
        lambda: not keys_under(client, agent_s3.bucket, f"{run_key}/checkpoints/checkpoint-10/"),
        30,
        "checkpoint-10 objects deleted",
    )
    assert keys_under(client, agent_s3.bucket, f"{run_key}/checkpoints/checkpoint-20/")


def failed_passes(proc: SyncProcess, reason: str) -> int:
    """How many of the sidecar's passes have failed with ``reason`` so far (one log line each)."""
    return proc.log().count(f"sync: {reason}: ")


def test_endpoint_down_during_upload_then_committed(
    tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    """The endpoint stays down until the sidecar has given up a pass on it twice (each pass
    after botocore's own retries), which proves it retries instead of exiting; then it comes
    back and the checkpoint is committed."""
    server = PrivateSeaweedFS(tmp_path / "seaweedfs")
    try:
        server.start()
        client = server.s3.client()
        ckdir = tmp_path / "ck"
        src = make_checkpoint(ckdir, 60, {"model.safetensors": 100 * MiB, "config.json": 500})
        uri = f"s3://{server.s3.bucket}/outage"
        proc = start_sync(
            syncs,
            agent_env(server.s3, uri, ckdir, TRAININGRUN_MAX_BANDWIDTH_MBPS="20"),
            tmp_path,
        )
        wait_log(proc, "checkpoint-60: uploading", timeout=60)
        time.sleep(1.5)
        server.stop()
        before = failed_passes(proc, "StorageUnavailable")  # some while it was shutting down
        wait_for(
            lambda: (
                failed_passes(proc, "StorageUnavailable") >= before + 2
                or proc.proc.poll() is not None
            ),
            240,
            "two passes failed with StorageUnavailable while the endpoint was down",
        )
        assert proc.proc.poll() is None, "sync exited while the endpoint was down"
        server.start()
        manifest = wait_committed(client, server.s3.bucket, "outage", 60, timeout=180)
        assert manifest["latest"] == 60
        restored = tmp_path / "restored"
        result = run_restore(agent_env(server.s3, uri, restored, TRAININGRUN_RESTORE_STEP="60"))
        assert result.returncode == 0, result.stderr
        assert same_tree(src, restored / "checkpoint-60")
    finally:
        for p in syncs:
            p.close()
        server.stop(keep_data=False)


def test_file_changing_during_upload_is_not_committed_until_stable(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    client = agent_s3.client()
    ckdir = tmp_path / "ck"
    folder = make_checkpoint(ckdir, 70, {"model.safetensors": 60 * MiB}, marked=False)
    weights = folder / "model.safetensors"
    proc = start_sync(
        syncs,
        agent_env(
            agent_s3,
            f"s3://{agent_s3.bucket}/{run_key}",
            ckdir,
            TRAININGRUN_MAX_BANDWIDTH_MBPS="20",
        ),
        tmp_path,
    )
    wait_log(proc, "checkpoint-70: uploading", timeout=60)
    with weights.open("ab") as f:  # the trainer is still writing
        f.write(b"y" * MiB)
    manifest = wait_committed(client, agent_s3.bucket, run_key, 70, timeout=120)
    assert "FileChanged" in proc.log()
    ckpt = json.loads(
        client.get_object(
            Bucket=agent_s3.bucket, Key=f"{run_key}/checkpoints/checkpoint-70/e1/r0/MANIFEST.json"
        )["Body"].read()
    )
    sizes = {f["path"]: f["size"] for f in ckpt["files"]}
    assert sizes["model.safetensors"] == 61 * MiB
    assert manifest["entries"][0]["step"] == 70


def test_name_escaping_the_folder_is_refused(agent_s3: S3, run_key: str, tmp_path: Path) -> None:
    client = agent_s3.client()
    prefix = f"{run_key}/checkpoints/checkpoint-3"
    client.put_object(Bucket=agent_s3.bucket, Key=f"{prefix}/x", Body=b"evil")
    evil = {
        "version": 1,
        "step": 3,
        "created": "2026-11-22T00:00:00Z",
        "files": [
            {"path": "../../x", "size": 4, "checksum_algorithm": "CRC32", "checksum": "AAAAAA=="}
        ],
    }
    client.put_object(
        Bucket=agent_s3.bucket, Key=f"{prefix}/MANIFEST.json", Body=json.dumps(evil).encode()
    )
    run_manifest = {
        "version": 1,
        "latest": 3,
        "entries": [
            {
                "step": 3,
                "prefix": "checkpoints/checkpoint-3/",
                "committed": "2026-11-22T00:00:00Z",
                "files": 1,
                "bytes": 4,
            }
        ],
    }
    client.put_object(
        Bucket=agent_s3.bucket,
        Key=f"{run_key}/manifest.json",
        Body=json.dumps(run_manifest).encode(),
    )
    restored = tmp_path / "a" / "b" / "restored"
    result = run_restore(
        agent_env(
            agent_s3,
            f"s3://{agent_s3.bucket}/{run_key}",
            restored,
            TRAININGRUN_RESTORE_STEP="3",
            TRAININGRUN_TERMINATION_LOG=str(tmp_path / "term"),
        )
    )
    assert result.returncode == EXIT_CHECKPOINT_BAD, result.stderr
    assert "'../../x'" in (tmp_path / "term").read_text()
    assert not list(tmp_path.rglob("x"))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{not json", id="malformed"),
        pytest.param(json.dumps({"version": 99, "entries": []}).encode(), id="future-version"),
    ],
)
def test_untrusted_manifest_is_never_overwritten(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess], body: bytes
) -> None:
    client = agent_s3.client()
    client.put_object(Bucket=agent_s3.bucket, Key=f"{run_key}/manifest.json", Body=body)
    ckdir = tmp_path / "ck"
    make_checkpoint(ckdir, 10, {"weights.bin": MiB})
    proc = start_sync(
        syncs, agent_env(agent_s3, f"s3://{agent_s3.bucket}/{run_key}", ckdir), tmp_path
    )
    wait_log(proc, "ManifestError", timeout=60)
    assert proc.terminate() == 0
    assert (
        client.get_object(Bucket=agent_s3.bucket, Key=f"{run_key}/manifest.json")["Body"].read()
        == body
    )
    assert "manifest.json" in proc.log()


def test_sigterm_drains_the_newest_checkpoint(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    client = agent_s3.client()
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    proc = start_sync(
        syncs,
        agent_env(
            agent_s3, f"s3://{agent_s3.bucket}/{run_key}", ckdir, TRAININGRUN_QUIET_SECONDS="600"
        ),
        tmp_path,
    )
    wait_log(proc, "endpoint:", timeout=60)
    # Saved at the last moment without the marker: the trainer has exited, so the drain counts
    # trainer_state.json as complete without waiting for the quiet period.
    make_checkpoint(ckdir, 50, {"model.safetensors": 50 * MiB}, marked=False)
    assert proc.terminate(timeout=90) == 0
    manifest = manifest_of(client, agent_s3.bucket, run_key)
    assert manifest is not None and manifest["latest"] == 50


def test_preemption_notice_becomes_a_save_request(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    ckdir = tmp_path / "ck"
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "annotations").write_text('kubectl.kubernetes.io/last-applied="{}"\n')
    start_sync(
        syncs,
        agent_env(
            agent_s3,
            f"s3://{agent_s3.bucket}/{run_key}",
            ckdir,
            TRAININGRUN_PODINFO_DIR=str(podinfo),
        ),
        tmp_path,
    )
    time.sleep(3)
    assert local.save_requested(ckdir) is None
    # Prepared before the trainer starts, writable whichever users the containers run as.
    assert (ckdir / local.CONTROL_DIR).stat().st_mode & 0o777 == 0o777
    (podinfo / "annotations").write_text(
        f'kubectl.kubernetes.io/last-applied="{{}}"\n{ANNOTATION_NOTICE}="karpenter.sh/disrupted"\n'
    )
    reason = wait_for(lambda: local.save_requested(ckdir), 30, "save-now request")
    assert "karpenter.sh/disrupted" in reason


def test_wrong_credentials_and_missing_bucket_are_named(
    agent_s3: S3, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    wrong = S3(
        agent_s3.endpoint, agent_s3.access_key, "not-the-secret", agent_s3.region, agent_s3.bucket
    )
    result = run_restore(
        agent_env(
            wrong,
            f"s3://{agent_s3.bucket}/{run_key}",
            tmp_path / "r",
            TRAININGRUN_RESTORE_STEP="1",
            TRAININGRUN_TERMINATION_LOG=str(tmp_path / "t1"),
        )
    )
    assert result.returncode == 1
    assert "access denied" in (tmp_path / "t1").read_text()
    assert "not-the-secret" not in result.stderr

    result = run_restore(
        agent_env(
            agent_s3,
            "s3://no-such-bucket-here/x",
            tmp_path / "r",
            TRAININGRUN_RESTORE_STEP="1",
            TRAININGRUN_TERMINATION_LOG=str(tmp_path / "t2"),
        )
    )
    assert result.returncode == 1
    assert "bucket 'no-such-bucket-here' does not exist" in (tmp_path / "t2").read_text()

    proc = start_sync(
        syncs, agent_env(wrong, f"s3://{agent_s3.bucket}/{run_key}", tmp_path / "ck"), tmp_path
    )
    wait_log(proc, "access denied", timeout=60)
    assert proc.proc.poll() is None  # keeps retrying: the trainer is never blocked
    assert "not-the-secret" not in proc.log()


def test_ranged_reads_come_straight_from_the_connection(agent_s3: S3, run_key: str) -> None:
    """The restore's reads take the direct path with the botocore and urllib3 of this build
    (an upgrade that changes their layers falls back to botocore's chunks: this says so), and
    hand over the range's bytes, all of them, in order, in blocks of at most READ_BLOCK."""
    client = agent_s3.client()
    data = bytes(range(256)) * (12 * 1024 + 7)  # 3 MiB and a bit, not a multiple of a block
    key = f"{run_key}/blob"
    client.put_object(Bucket=agent_s3.bucket, Key=key, Body=data)
    resp = client.get_object(Bucket=agent_s3.bucket, Key=key, Range="bytes=0-9")
    assert socket_reader(resp["Body"]) is not None
    resp["Body"].close()

    got, sizes = bytearray(), []

    def sink(block: bytes | memoryview) -> None:
        got.extend(block)
        sizes.append(len(block))

    store = S3Store(client, agent_s3.bucket)
    assert store.read_range(key, 5, len(data) - 2, sink) == len(data) - 6
    assert bytes(got) == data[5:-1]
    assert max(sizes) <= READ_BLOCK
