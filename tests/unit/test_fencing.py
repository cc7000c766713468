"""Two attempts' sidecars saving the same steps, against moto's in-memory S3 (which honours
If-None-Match and If-Match): the real ``Sync`` over real folders, the operator's fence, the
operator's choice and the real restore.

The reproduction this guards: the old attempt commits checkpoint-1000; the new attempt
(resumed from 900) reaches step 1000 and uploads it too. In version 1 its PUTs overwrote the
committed objects, the choice still picked 1000 (sizes matched), the restore found wrong
checksums and exited 3, and committed work was lost. Now each attempt writes under its own keys
and a step is committed once:

- committed by attempt 1 before the fence moved: attempt 2's upload of step 1000 lands beside
  it, the entry stays attempt 1's, the choice picks 1000 and the restore gives attempt 1's bytes;
- attempt 1 still saving after the fence moved: it is refused (and stops uploading), attempt 2
  commits step 1000, and the restore gives attempt 2's bytes;
- a sidecar of an old attempt started late stops at its first look at the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from tests.unit.fakes import BUCKET, DictStore
from trainingrun.agent.restore import RestoreSettings, restore
from trainingrun.agent.sync import Sync, SyncSettings
from trainingrun.checkpoint import local
from trainingrun.checkpoint.commit import Capabilities, Committer, take_fence
from trainingrun.checkpoint.lookup import choose_checkpoint, read_run_manifest
from trainingrun.checkpoint.protocol import Fenced
from trainingrun.storage.checksum import CRC64NVME
from trainingrun.storage.opener import Location, StorageRejected, Store

RUN = Location(BUCKET, "runs/ml/r1")
UID = "0f3c-run"


def _save(folder: Path, step: int, attempt: int) -> None:
    """A complete checkpoint-<step>/ as a diverged attempt would write it: same names, other
    bytes (and the same sizes, which is what fooled the size check)."""
    ckpt = folder / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(bytes([attempt]) * 4096)
    (ckpt / "trainer_state.json").write_text(f'{{"global_step": {step}, "a": {attempt}}}')
    local.mark_complete(ckpt)


def _sidecar(store: Store, folder: Path, attempt: int, epoch: int) -> Sync:
    settings = SyncSettings(
        checkpoint_dir=folder, run=RUN, keep=3, quiet_seconds=0, epoch=epoch, attempt=attempt
    )
    sync = Sync(store, settings)
    sync.start()
    return sync


def _restored(store: Store, tmp_path: Path, step: int) -> bytes:
    target = tmp_path / "restored"
    folder = restore(store, RestoreSettings(checkpoint_dir=target, run=RUN, step=step))
    return (folder / "model.safetensors").read_bytes()


def _entries(store: Store) -> list[tuple[int, int, int]]:
    manifest = read_run_manifest(store, RUN)
    assert manifest is not None
    return [(e.step, e.epoch, e.attempt) for e in manifest.entries]


def test_a_step_committed_by_the_old_attempt_is_never_overwritten(
    store: Store, tmp_path: Path
) -> None:
    old_dir, new_dir = tmp_path / "a1", tmp_path / "a2"
    _, epoch1 = take_fence(store, RUN, UID, 1)
    old = _sidecar(store, old_dir, 1, epoch1)
    _save(old_dir, 900, 1)
    _save(old_dir, 1000, 1)
    old.sync_once(trainer_gone=False)
    assert _entries(store) == [(900, 1, 1), (1000, 1, 1)]

    _, epoch2 = take_fence(store, RUN, UID, 2)
    new = _sidecar(store, new_dir, 2, epoch2)
    _save(new_dir, 1000, 2)  # resumed from 900, reached 1000 again with other bytes
    new.sync_once(trainer_gone=False)

    assert _entries(store) == [(900, 1, 1), (1000, 1, 1)], "step 1000 is committed once"
    choice = choose_checkpoint(store, RUN, set())
    assert choice.entry is not None and choice.entry.step == 1000
    assert _restored(store, tmp_path, 1000) == bytes([1]) * 4096


def test_an_old_attempt_saving_after_the_fence_moved_is_refused_and_stops(
    store: Store, tmp_path: Path
) -> None:
    old_dir, new_dir = tmp_path / "a1", tmp_path / "a2"
    _, epoch1 = take_fence(store, RUN, UID, 1)
    old = _sidecar(store, old_dir, 1, epoch1)
    _save(old_dir, 900, 1)
    old.sync_once(trainer_gone=False)

    _, epoch2 = take_fence(store, RUN, UID, 2)  # the operator, before attempt 2's pod exists
    _save(old_dir, 1000, 1)  # the old pod, partitioned, keeps training and saving
    old.sync_once(trainer_gone=False)
    assert old.fenced is not None and old.fenced.fence == epoch2
    assert old.metrics.registry.get_sample_value("trainingrun_sync_fenced") == 1
    assert _entries(store) == [(900, 1, 1)]

    new = _sidecar(store, new_dir, 2, epoch2)
    _save(new_dir, 1000, 2)
    new.sync_once(trainer_gone=False)
    assert _entries(store) == [(900, 1, 1), (1000, 2, 2)]
    assert _restored(store, tmp_path, 1000) == bytes([2]) * 4096

    _save(old_dir, 1100, 1)
    keys_before = {k for k, _ in store.list_objects(RUN.key("checkpoints") + "/")}
    old.sync_once(trainer_gone=False)  # fenced: nothing more is uploaded
    assert {k for k, _ in store.list_objects(RUN.key("checkpoints") + "/")} == keys_before


def test_an_old_sidecar_started_late_stops_at_its_first_look(store: Store, tmp_path: Path) -> None:
    _, epoch1 = take_fence(store, RUN, UID, 1)
    take_fence(store, RUN, UID, 2)
    late = Sync(
        store,
        SyncSettings(checkpoint_dir=tmp_path / "a1", run=RUN, quiet_seconds=0, epoch=epoch1),
    )
    _save(tmp_path / "a1", 100, 1)
    with pytest.raises(Fenced, match=f"epoch {epoch1} is fenced") as raised:
        late.start()
    late.on_fenced(raised.value)
    late.sync_once(trainer_gone=True)
    assert list(store.list_objects(RUN.key("checkpoints") + "/")) == []


class _NoConditions(DictStore):
    """An endpoint that refuses If-None-Match and If-Match with a 4xx."""

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        content_type: str = "application/json",
    ) -> str:
        if if_none_match or if_match:
            raise StorageRejected(f"{key}: the endpoint refused the request (NotImplemented)")
        return super().put(key, data, content_type=content_type)


def test_the_fence_is_taken_on_an_endpoint_that_refuses_conditions() -> None:
    bucket = _NoConditions()
    store = cast(Store, bucket)
    manifest, epoch = take_fence(store, RUN, UID, 1)
    assert (manifest.fence, manifest.fence_holder, epoch) == (1, f"{UID}/1", 1)
    assert take_fence(store, RUN, UID, 1)[1] == 1
    assert take_fence(store, RUN, UID, 2)[1] == 2


def test_a_sweep_of_some_steps_lists_and_deletes_only_their_folders() -> None:
    bucket = DictStore()
    store = cast(Store, bucket)
    take_fence(store, RUN, UID, 1)
    manifest, epoch2 = take_fence(store, RUN, UID, 2)
    left = [RUN.key(f"checkpoints/checkpoint-{step}/e1/r0/model.bin") for step in (10, 20)]
    for key in left:
        bucket.put(key, b"old")
    caps = Capabilities(CRC64NVME, verifies_checksums=True, conditional_writes=True)
    committer = Committer(store, RUN, caps, keep=3, epoch=epoch2)

    assert committer.sweep(manifest, (), steps=[10]) == 1
    assert sorted(bucket.objects) == sorted([RUN.key("manifest.json"), left[1]])
    assert committer.sweep(manifest) == 1  # all folders: what the sidecar does at its start
    assert list(bucket.objects) == [RUN.key("manifest.json")]


def test_the_fence_starts_from_the_manifest_the_pass_just_read() -> None:
    bucket = DictStore()
    take_fence(cast(Store, bucket), RUN, UID, 1)
    got = bucket.get_with_etag(RUN.key("manifest.json"))
    bucket.gets.clear()

    manifest, epoch = take_fence(cast(Store, bucket), RUN, UID, 2, seen=got)

    # No first read: the compare-and-swap on the ETag seen, then the read that confirms it.
    assert bucket.gets == [RUN.key("manifest.json")]
    assert (manifest.fence, epoch) == (2, 2)


def test_a_stale_manifest_seen_costs_one_more_read_and_loses_nothing() -> None:
    bucket = DictStore()
    take_fence(cast(Store, bucket), RUN, UID, 1)
    stale = bucket.get_with_etag(RUN.key("manifest.json"))
    take_fence(cast(Store, bucket), RUN, UID, 2)  # the manifest changed since it was seen
    bucket.gets.clear()

    manifest, epoch = take_fence(cast(Store, bucket), RUN, UID, 3, seen=stale)

    # The compare-and-swap on the stale ETag failed; the next try read afresh.
    assert bucket.gets == [RUN.key("manifest.json")] * 2
    assert (manifest.fence, epoch) == (3, 3)
    assert read_run_manifest(cast(Store, bucket), RUN) == manifest
