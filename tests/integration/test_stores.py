"""The commit protocol on each store: real ``trainingrun sync`` and ``trainingrun restore``
processes against SeaweedFS and MinIO (s3://), fake-gcs-server (gs://) and Azurite (az://), one
test body per case, run on all four (the ``bucket`` fixture).

- A fault: the sidecar SIGKILLed mid-upload commits nothing partial; restarted, it clears the
  unfinished upload (not on MinIO, which does not list it under the run) and commits, and the
  restore is bit for bit.
- Two writers of manifest.json at once lose no step (create-only and compare-and-swap on the
  store's own versions: ETag, generation).
- An object corrupted after its commit, a file's own or a pack's: the restore exits 3 naming
  the file, leaving no folder.
- Upgrade: a version-1 bucket gets the fence in place, resumes, and retention later deletes the
  version-1 files.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.integration.agents import (
    SyncProcess,
    make_checkpoint,
    run_restore,
    start_sync,
    wait_log,
)
from tests.integration.stores import Bucket
from tests.integration.support import commit_checkpoint_to, wait_for
from tests.integration.test_sync_restore import same_tree
from trainingrun.checkpoint.commit import Capabilities, Committer, take_fence
from trainingrun.checkpoint.manifest import MANIFEST_VERSION, PACK_DIR, CheckpointManifest
from trainingrun.contract import EXIT_CHECKPOINT_BAD
from trainingrun.storage.checksum import CRC32C

MiB = 1 << 20
# Where the first attempt's sidecar uploads checkpoint-40's large file, relative to the run.
LARGE_KEY = "checkpoints/checkpoint-40/e1/r0/model.safetensors"


def test_sigkill_mid_upload_commits_nothing_partial_then_restart_commits(
    bucket: Bucket, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    store = bucket.store()
    ckdir = tmp_path / "ck"
    src = make_checkpoint(ckdir, 40, {"model.safetensors": 64 * MiB, "config.json": 500})
    uri = bucket.uri(run_key)
    slow = start_sync(syncs, bucket.env(uri, ckdir, TRAININGRUN_MAX_BANDWIDTH_MBPS="16"), tmp_path)
    wait_log(slow, "checkpoint-40: uploading", timeout=60)
    # Killed once the store shows the unfinished upload (S3 uploads, GCS part objects, Azure
    # staged blocks), well inside the ~4 s the throttled upload takes. MinIO shows it only to a
    # listing of its exact key.
    listed = run_key if bucket.lists_uploads_by_prefix else f"{run_key}/{LARGE_KEY}"
    wait_for(lambda: store.list_multipart(listed), 30, "an unfinished upload listed")
    slow.kill()
    assert not (bucket.manifest(run_key) or {}).get("entries")
    assert not [k for k in bucket.keys(run_key) if k.endswith("MANIFEST.json")]
    assert store.list_multipart(listed)

    again = start_sync(syncs, bucket.env(uri, ckdir), tmp_path)
    bucket.wait_committed(run_key, 40, timeout=120)
    if bucket.lists_uploads_by_prefix:
        assert "aborted 1 unfinished multipart uploads" in again.log()
        assert not store.list_multipart(run_key)
    else:  # the sidecar cannot find it: MinIO's own expiry removes it (docs/storage-s3.md)
        assert len(store.list_multipart(listed)) == 1
    restored = tmp_path / "restored"
    result = run_restore(bucket.env(uri, restored, TRAININGRUN_RESTORE_STEP="40"))
    assert result.returncode == 0, result.stderr
    assert same_tree(src, restored / "checkpoint-40")


def test_two_writers_updating_manifest_at_once_lose_nothing(bucket: Bucket, run_key: str) -> None:
    run = bucket.location(run_key)
    caps = Capabilities(CRC32C, verifies_checksums=True, conditional_writes=True)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(steps: range) -> None:
        committer = Committer(bucket.store(), run, caps, keep=1000, epoch=1)
        barrier.wait(timeout=30)
        try:
            for step in steps:
                part = CheckpointManifest(
                    version=MANIFEST_VERSION, step=step, files=[], created="t", epoch=1
                )
                committer.write_part(part)
                assert committer.try_commit(step).committed
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=writer, args=(range(0, 30, 2),)),
        threading.Thread(target=writer, args=(range(1, 30, 2),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    manifest = bucket.manifest(run_key)
    assert manifest is not None
    assert sorted(e["step"] for e in manifest["entries"]) == list(range(30))


@pytest.mark.parametrize("victim", ["model.safetensors", "config.json"], ids=["own", "packed"])
def test_object_corrupted_after_commit_restore_exits_checkpoint_bad(
    bucket: Bucket, run_key: str, tmp_path: Path, syncs: list[SyncProcess], victim: str
) -> None:
    store = bucket.store()
    ckdir = tmp_path / "ck"
    make_checkpoint(ckdir, 10, {"model.safetensors": 3 * MiB, "config.json": 500})
    uri = bucket.uri(run_key)
    start_sync(syncs, bucket.env(uri, ckdir), tmp_path)
    bucket.wait_committed(run_key, 10, timeout=60)
    # config.json and trainer_state.json are small: they went up in one pack.
    part = f"{run_key}/checkpoints/checkpoint-10/e1/r0/"
    raw = store.get(part + "MANIFEST.json")
    assert raw is not None
    files = {f["path"]: f for f in json.loads(raw)["files"]}
    assert files["config.json"]["pack"] == files["trainer_state.json"]["pack"] == PACK_DIR + "/0"
    assert files["model.safetensors"]["pack"] is None
    entry = files[victim]
    key = part + (entry["pack"] or victim)
    head = store.head(key)  # a pack holds trainer_state.json too: all of it is put back
    assert head is not None
    size = head[0]
    assert sorted(k[len(part) :] for k in bucket.keys(run_key) if k.startswith(part)) == [
        f"{PACK_DIR}/0",
        "MANIFEST.json",
        "model.safetensors",
    ]
    body = bytearray()
    assert store.read_range(key, 0, size - 1, body.extend) == size
    body[entry["offset"] + entry["size"] // 2] ^= 0xFF  # one flipped byte, same size
    store.put(key, bytes(body), content_type="application/octet-stream")

    restored = tmp_path / "restored"
    term = tmp_path / "termination-log"
    env = bucket.env(
        uri, restored, TRAININGRUN_RESTORE_STEP="10", TRAININGRUN_TERMINATION_LOG=str(term)
    )
    result = run_restore(env)
    assert result.returncode == EXIT_CHECKPOINT_BAD, result.stderr
    message = term.read_text()
    assert "checkpoint-10" in message and victim in message
    assert "checksum" in message
    assert not (restored / "checkpoint-10").exists()
    assert not [p for p in restored.iterdir() if p.name.startswith(".restore")]


def test_a_version_1_bucket_resumes_under_version_2(
    bucket: Bucket, run_key: str, tmp_path: Path, syncs: list[SyncProcess]
) -> None:
    store = bucket.store()
    uri = bucket.uri(run_key)
    weights = bytes(range(256)) * 4096
    commit_checkpoint_to(store, run_key, 20, {"model.safetensors": weights})
    v1 = bucket.manifest(run_key)
    assert v1 is not None
    for entry in v1["entries"]:
        for name in ("epoch", "attempt", "ranks"):
            entry.pop(name, None)
    v1_body = {"version": 1, "entries": v1["entries"], "latest": 20}
    store.put(f"{run_key}/manifest.json", json.dumps(v1_body).encode())

    # The operator takes the fence for the next attempt: the manifest becomes version 2.
    manifest, epoch = take_fence(store, bucket.location(run_key), "uid", 3)
    assert (manifest.version, manifest.fence, [e.step for e in manifest.entries]) == (2, 1, [20])
    upgraded = bucket.manifest(run_key)
    assert upgraded is not None
    assert (upgraded["version"], upgraded["entries"][0]["epoch"]) == (2, 0)

    restored = tmp_path / "restored"
    result = run_restore(bucket.env(uri, restored, TRAININGRUN_RESTORE_STEP="20"))
    assert result.returncode == 0, result.stderr
    assert (restored / "checkpoint-20" / "model.safetensors").read_bytes() == weights

    ckdir = tmp_path / "ck"
    make_checkpoint(ckdir, 30, {"model.safetensors": MiB})
    env = bucket.env(uri, ckdir, TRAININGRUN_EPOCH=str(epoch), TRAININGRUN_KEEP="1")
    proc = start_sync(syncs, env, tmp_path)
    after = bucket.wait_committed(run_key, 30, timeout=60)
    assert [(e["step"], e["epoch"]) for e in after["entries"]] == [(30, epoch)]
    wait_for(
        lambda: not bucket.keys(f"{run_key}/checkpoints/checkpoint-20/"),
        30,
        "the version-1 checkpoint's files deleted by retention",
    )
    assert proc.terminate() == 0
