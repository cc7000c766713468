"""The fenced, rank-aware commit protocol's pure decisions (``trainingrun.checkpoint.protocol``).

Covers:

- take_fence(): the first fence; the same (uid, attempt) again, with no write (a version-1
  manifest is still written back as version 2); fence + 1 for the next attempt, a new run uid,
  an empty or foreign holder; StaleAttempt for an older attempt of the holder's uid;
- commit(): Fenced (epoch, fence, holder) when a newer epoch holds the fence, checked first; a
  step committed by any epoch gives no write; a committer ahead of the fence raises it (holder
  cleared), one at the fence leaves both; retention drops the oldest, or the new entry itself;
- missing_ranks(); merged_files(): identical shared files once, from the first part; a
  conflict in size or checksum names the path and both ranks;
- key_owner() on version-2, version-1 and foreign keys, and as the inverse of part_prefix;
- sweepable(): a bucket of every kind of key, each kept or swept for its reason; abortable();
- properties (hypothesis): sweepable never returns a key of a committed (step, epoch), of a
  committed version-1 step, of the own or a newer epoch unless retention dropped its step, or
  outside ``checkpoints/``, and returns every other uncommitted key of an older epoch; commit()
  keeps the manifest parseable with a fence at least the entry's epoch.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainingrun.checkpoint.manifest import (
    MANIFEST_VERSION,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    ManifestError,
    RunManifest,
    epoch_prefix,
    parse_run_manifest,
    part_prefix,
)
from trainingrun.checkpoint.protocol import (
    Fenced,
    StaleAttempt,
    abortable,
    commit,
    holder_of,
    key_owner,
    merged_files,
    missing_ranks,
    sweepable,
    take_fence,
)

UID = "uid-1"


def _entry(step: int, epoch: int = 0, ranks: int = 1, committed: str = "t") -> ManifestEntry:
    return ManifestEntry(
        step=step,
        prefix=epoch_prefix(step, epoch),
        committed=committed,
        files=2,
        bytes=10,
        epoch=epoch,
        ranks=ranks,
    )


def _manifest(*entries: ManifestEntry, fence: int = 0, holder: str = "", **kw: Any) -> RunManifest:
    return RunManifest(entries=list(entries), fence=fence, fence_holder=holder, **kw)


# -- take_fence ------------------------------------------------------------------------------

V1 = _manifest(_entry(5), _entry(10), version=1)


@pytest.mark.parametrize(
    ("before", "uid", "attempt", "epoch", "holder"),
    [
        pytest.param(None, UID, 1, 1, "uid-1/1", id="empty-bucket"),
        pytest.param(_manifest(fence=1, holder="uid-1/1"), UID, 2, 2, "uid-1/2", id="next-attempt"),
        pytest.param(_manifest(fence=4, holder="uid-1/3"), "uid-2", 1, 5, "uid-2/1", id="new-uid"),
        pytest.param(_manifest(fence=3), UID, 1, 4, "uid-1/1", id="no-holder"),
        pytest.param(_manifest(fence=2, holder="odd"), UID, 1, 3, "uid-1/1", id="foreign-holder"),
        pytest.param(
            _manifest(fence=2, holder="uid-1/x"), UID, 1, 3, "uid-1/1", id="holder-not-a-number"
        ),
        pytest.param(V1, UID, 1, 1, "uid-1/1", id="version-1-manifest"),
        pytest.param(
            _manifest(fence=2, holder="sync@h/1"), "sync@h", 2, 3, "sync@h/2", id="sidecar-holder"
        ),
    ],
)
def test_take_fence_writes_the_next_epoch(
    before: RunManifest | None, uid: str, attempt: int, epoch: int, holder: str
) -> None:
    updated, got = take_fence(before, uid, attempt)

    assert got == epoch
    assert updated is not None
    assert (updated.fence, updated.fence_holder, updated.version) == (epoch, holder, 2)
    assert updated.entries == (before.entries if before else [])
    assert parse_run_manifest(updated.to_json()) == updated


@pytest.mark.parametrize("version", [MANIFEST_VERSION, 1], ids=["v2-no-write", "v1-rewritten"])
def test_take_fence_again_for_the_same_attempt_is_the_same_epoch(version: int) -> None:
    held = _manifest(_entry(5), fence=3, holder=holder_of(UID, 2), version=version)

    updated, epoch = take_fence(held, UID, 2)

    assert epoch == 3
    assert updated == (None if version == 2 else held.model_copy(update={"version": 2}))


@pytest.mark.parametrize("attempt", [1, 2], ids=["attempt-1", "attempt-2"])
def test_take_fence_for_an_older_attempt_is_stale(attempt: int) -> None:
    held = _manifest(fence=7, holder=holder_of(UID, 3))

    with pytest.raises(StaleAttempt, match=f"attempt 3 of this run .* attempt {attempt} is not"):
        take_fence(held, UID, attempt)


# -- commit ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "holder_named"),
    [
        pytest.param(_manifest(fence=3, holder="uid-1/2"), "uid-1/2", id="newer-fence"),
        pytest.param(_manifest(fence=3), "unknown holder", id="newer-fence-no-holder"),
        pytest.param(
            _manifest(_entry(10, epoch=2), fence=3, holder="uid-1/2"),
            "uid-1/2",
            id="fenced-before-already",
        ),
    ],
)
def test_commit_by_an_older_epoch_is_fenced(before: RunManifest, holder_named: str) -> None:
    with pytest.raises(Fenced, match=f"epoch 2 is fenced: epoch 3 \\({holder_named}\\)") as e:
        commit(before, _entry(10, epoch=2), keep=5)

    assert (e.value.epoch, e.value.fence, e.value.holder) == (2, 3, before.fence_holder)


@pytest.mark.parametrize(
    "committed",
    [
        pytest.param(_entry(10, epoch=2), id="same-epoch"),
        pytest.param(_entry(10, epoch=1), id="older-epoch"),
        pytest.param(_entry(10), id="version-1"),
    ],
)
def test_a_committed_step_is_not_committed_again(committed: ManifestEntry) -> None:
    before = _manifest(committed, fence=2, holder="uid-1/2")

    assert commit(before, _entry(10, epoch=2, ranks=2, committed="later"), keep=5) == (None, [])


@pytest.mark.parametrize(
    ("before", "epoch", "fence", "holder"),
    [
        pytest.param(None, 1, 1, "", id="no-manifest"),
        pytest.param(_manifest(fence=1, holder="uid-1/1"), 3, 3, "", id="ahead-raises-it"),
        pytest.param(_manifest(fence=3, holder="uid-1/2"), 3, 3, "uid-1/2", id="at-the-fence"),
        pytest.param(V1, 2, 2, "", id="version-1-manifest"),
    ],
)
def test_commit_writes_the_entry_under_a_fence_at_least_its_epoch(
    before: RunManifest | None, epoch: int, fence: int, holder: str
) -> None:
    entry = _entry(20, epoch=epoch, ranks=2)

    updated, dropped = commit(before, entry, keep=5)

    assert updated is not None
    assert (updated.fence, updated.fence_holder, updated.version) == (fence, holder, 2)
    assert updated.entries == [*(before.entries if before else []), entry]
    assert dropped == []
    assert parse_run_manifest(updated.to_json()) == updated


@pytest.mark.parametrize(
    ("step", "kept", "dropped"),
    [
        pytest.param(30, [20, 30], [10], id="drops-the-oldest"),
        pytest.param(5, [10, 20], [5], id="drops-the-new-entry-itself"),
    ],
)
def test_commit_applies_retention(step: int, kept: list[int], dropped: list[int]) -> None:
    before = _manifest(_entry(10, epoch=1), _entry(20, epoch=2), fence=2)

    updated, gone = commit(before, _entry(step, epoch=2), keep=2)

    assert updated is not None
    assert [e.step for e in updated.entries] == kept
    assert [e.step for e in gone] == dropped


# -- parts -----------------------------------------------------------------------------------


def _file(path: str, size: int = 4, checksum: str = "AAAAAAAAAAA=") -> FileEntry:
    return FileEntry(path=path, size=size, checksum_algorithm="CRC64NVME", checksum=checksum)


def _part(rank: int, *files: FileEntry, step: int = 7, epoch: int = 2) -> CheckpointManifest:
    return CheckpointManifest(
        version=MANIFEST_VERSION,
        step=step,
        files=list(files),
        created="t",
        epoch=epoch,
        rank=rank,
        ranks=3,
    )


def _parts(*parts: CheckpointManifest) -> list[tuple[str, CheckpointManifest]]:
    return [(part_prefix(p.step, p.epoch, p.rank), p) for p in parts]


@pytest.mark.parametrize(
    ("present", "ranks", "missing"),
    [
        pytest.param([], 1, [0], id="none-of-one"),
        pytest.param([0], 1, [], id="all-of-one"),
        pytest.param([0], 2, [1], id="rank-1-missing"),
        pytest.param([1], 3, [0, 2], id="two-missing"),
        pytest.param([2, 0, 1], 3, [], id="all-of-three"),
        pytest.param([5], 2, [0, 1], id="a-rank-out-of-range-does-not-count"),
    ],
)
def test_missing_ranks(present: list[int], ranks: int, missing: list[int]) -> None:
    assert missing_ranks({r: _part(r) for r in present}, ranks) == missing


def test_merged_files_puts_every_rank_in_one_folder() -> None:
    shared = _file("config.json")
    parts = _parts(
        _part(0, _file("model-0.bin"), shared),
        _part(1, _file("model-1.bin"), shared),
    )

    merged = merged_files(parts)

    assert [key for key, _ in merged] == [
        "checkpoints/checkpoint-7/e2/r0/model-0.bin",
        "checkpoints/checkpoint-7/e2/r0/config.json",
        "checkpoints/checkpoint-7/e2/r1/model-1.bin",
    ]
    assert [f.path for _, f in merged] == ["model-0.bin", "config.json", "model-1.bin"]


def test_merged_files_of_a_version_1_checkpoint_keep_its_folder() -> None:
    part = _part(0, _file("model.bin"), epoch=0)

    assert merged_files(_parts(part)) == [("checkpoints/checkpoint-7/model.bin", part.files[0])]


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(_file("config.json", size=5), id="other-size"),
        pytest.param(_file("config.json", checksum="AQEBAQEBAQE="), id="other-checksum"),
    ],
)
def test_merged_files_refuses_one_path_with_two_contents(other: FileEntry) -> None:
    parts = _parts(_part(0, _file("config.json")), _part(1, _file("a")), _part(2, other))

    with pytest.raises(ManifestError, match=r"checkpoint-7: ranks 0 and 2 both wrote config\.json"):
        merged_files(parts)


# -- key_owner and abortable -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "owner"),
    [
        pytest.param("checkpoints/checkpoint-7/e3/r1/model.bin", (7, 3, 1), id="v2-file"),
        pytest.param("checkpoints/checkpoint-7/e3/r1/MANIFEST.json", (7, 3, 1), id="v2-part"),
        pytest.param("checkpoints/checkpoint-7/e12/r10/a/b.pt", (7, 12, 10), id="v2-deep"),
        pytest.param("checkpoints/checkpoint-7/e3/stray.bin", (7, 3, None), id="epoch-no-rank"),
        pytest.param("checkpoints/checkpoint-7/e3/r1x/f", (7, 3, None), id="not-a-rank"),
        pytest.param("checkpoints/checkpoint-7/model.bin", (7, 0, None), id="v1-file"),
        pytest.param("checkpoints/checkpoint-7/MANIFEST.json", (7, 0, None), id="v1-part"),
        pytest.param("checkpoints/checkpoint-7/e3x/f", (7, 0, None), id="v1-e-folder"),
        pytest.param("checkpoints/checkpoint-7/e3", (7, 0, None), id="v1-file-named-e3"),
        pytest.param("checkpoints/checkpoint-7/sub/e3/r1/f", (7, 0, None), id="v1-deep-e3"),
        pytest.param("manifest.json", None, id="run-manifest"),
        pytest.param(".trainingrun-probe-1", None, id="probe"),
        pytest.param("checkpoints/checkpoint-7", None, id="no-slash"),
        pytest.param("checkpoints/checkpoint-x/f", None, id="step-not-a-number"),
        pytest.param("checkpoints/latest/f", None, id="other-folder"),
        pytest.param("logs/checkpoints/checkpoint-7/f", None, id="not-at-the-start"),
    ],
)
def test_key_owner(key: str, owner: tuple[int, int, int | None] | None) -> None:
    assert key_owner(key) == owner


names = st.lists(st.sampled_from(["a", "b.bin", "e1", "r0", "MANIFEST.json"]), min_size=1).map(
    "/".join
)


@given(st.integers(0, 10**9), st.integers(0, 50), st.integers(0, 50), names)
def test_key_owner_inverts_part_prefix(step: int, epoch: int, rank: int, name: str) -> None:
    rank = rank if epoch else 0

    owner = key_owner(part_prefix(step, epoch, rank) + name)

    if epoch:
        assert owner == (step, epoch, rank)
    elif name.startswith("e1/"):
        # A version-1 file in a folder named like an epoch reads as that epoch's: why sweepable
        # keeps every key of a committed version-1 step.
        assert owner == (step, 1, 0 if name.startswith("e1/r0/") else None)
    else:
        assert owner == (step, 0, None)


@pytest.mark.parametrize(
    ("key", "aborted"),
    [
        pytest.param("checkpoints/checkpoint-7/e3/r1/model.bin", True, id="own-epoch-and-rank"),
        pytest.param("checkpoints/checkpoint-7/e3/r0/model.bin", False, id="own-epoch-other-rank"),
        pytest.param("checkpoints/checkpoint-7/e3/stray.bin", False, id="own-epoch-no-rank"),
        pytest.param("checkpoints/checkpoint-7/e2/r0/model.bin", True, id="older-epoch"),
        pytest.param("checkpoints/checkpoint-7/e2/r1/model.bin", True, id="older-epoch-same-rank"),
        pytest.param("checkpoints/checkpoint-7/e2/stray.bin", True, id="older-epoch-no-rank"),
        pytest.param("checkpoints/checkpoint-7/model.bin", True, id="version-1"),
        pytest.param("checkpoints/checkpoint-7/e4/r1/model.bin", False, id="newer-epoch"),
        pytest.param("checkpoints/checkpoint-7/e4/r0/model.bin", False, id="newer-other-rank"),
        pytest.param("other/checkpoint-7/e1/r1/model.bin", False, id="foreign"),
    ],
)
def test_abortable_by_epoch_3_rank_1(key: str, aborted: bool) -> None:
    assert abortable(key, epoch=3, rank=1) is aborted


# -- sweepable -------------------------------------------------------------------------------

# Committer of epoch 4, after a commit that wrote MANIFEST (retention dropped DROPPED).
MANIFEST = _manifest(_entry(5), _entry(20, epoch=2, ranks=2), _entry(30, epoch=4), fence=4)
DROPPED = [_entry(10, epoch=1), _entry(15, epoch=4)]
KEYS = {
    "checkpoints/checkpoint-10/e1/r0/model.bin": True,  # retention dropped it
    "checkpoints/checkpoint-10/e1/r0/MANIFEST.json": True,
    "checkpoints/checkpoint-15/e4/r0/model.bin": True,  # dropped though of the own epoch
    "checkpoints/checkpoint-5/model.bin": False,  # committed version-1 step
    "checkpoints/checkpoint-5/MANIFEST.json": False,
    "checkpoints/checkpoint-5/e3/model.bin": False,  # version-1 files in an epoch-like folder
    "checkpoints/checkpoint-5/e3/r0/model.bin": False,
    "checkpoints/checkpoint-20/e2/r1/model.bin": False,  # committed, older epoch
    "checkpoints/checkpoint-20/e3/r0/model.bin": True,  # older epoch, uncommitted
    "checkpoints/checkpoint-30/e4/r0/model.bin": False,  # committed now
    "checkpoints/checkpoint-40/e4/r1/model.bin": False,  # own epoch in flight
    "checkpoints/checkpoint-40/e4/stray.bin": False,
    "checkpoints/checkpoint-40/e5/r0/model.bin": False,  # newer epoch
    "checkpoints/checkpoint-40/e1/r0/model.bin": True,  # older epoch, never committed
    "checkpoints/checkpoint-40/e2/stray.bin": True,
    "checkpoints/checkpoint-45/model.bin": True,  # version-1, never committed
    "checkpoints/checkpoint-10/e4/r0/model.bin": False,  # not the dropped entry's epoch
    "manifest.json": False,
    "checkpoints/latest/model.bin": False,
}


@pytest.mark.parametrize(("key", "swept"), list(KEYS.items()), ids=list(KEYS))
def test_sweepable(key: str, swept: bool) -> None:
    assert (key in sweepable(list(KEYS), MANIFEST, 4, DROPPED)) is swept


def test_a_dropped_entry_that_is_committed_is_kept() -> None:
    keys = ["checkpoints/checkpoint-30/e4/r0/model.bin", "checkpoints/checkpoint-5/model.bin"]

    assert sweepable(keys, MANIFEST, 4, [_entry(30, epoch=4), _entry(5)]) == []


def test_a_dropped_version_1_entry_takes_its_files() -> None:
    keys = ["checkpoints/checkpoint-5/model.bin", "checkpoints/checkpoint-5/MANIFEST.json"]
    after = _manifest(_entry(30, epoch=1), fence=1)

    assert sweepable(keys, after, 1, [_entry(5)]) == keys


# -- properties ------------------------------------------------------------------------------

SMALL = st.integers(0, 4)
owned_keys = st.builds(
    lambda step, epoch, rank: (
        f"checkpoints/checkpoint-{step}/"
        + (f"e{epoch}/" if epoch else "")
        + (f"r{rank}/" if epoch and rank is not None else "")
        + "f.bin"
    ),
    SMALL,
    SMALL,
    st.none() | SMALL,
)
any_keys = st.lists(owned_keys | st.sampled_from(["manifest.json", "checkpoints/x/f"]))
committed_pairs = st.dictionaries(SMALL, SMALL, max_size=5)  # step -> epoch


@settings(max_examples=300)
@given(any_keys, committed_pairs, committed_pairs, st.integers(1, 5))
def test_sweepable_never_takes_what_may_still_be_needed(
    keys: list[str], committed: dict[int, int], dropped: dict[int, int], epoch: int
) -> None:
    manifest = _manifest(*(_entry(s, e) for s, e in committed.items()), fence=epoch)
    gone = [_entry(s, e) for s, e in dropped.items()]

    swept = sweepable(keys, manifest, epoch, gone)

    assert set(swept) <= set(keys)
    for key in keys:
        owner = key_owner(key)
        if owner is None:
            assert key not in swept
            continue
        step, key_epoch, _ = owner
        is_committed = committed.get(step) in (key_epoch, 0)
        was_dropped = dropped.get(step) == key_epoch
        if is_committed or (key_epoch >= epoch and not was_dropped):
            assert key not in swept, f"{key} swept by epoch {epoch}, committed {committed}"
        else:
            assert key in swept, f"{key} left by epoch {epoch}, committed {committed}"


@given(committed_pairs, st.integers(0, 6), SMALL, st.integers(1, 4))
def test_commit_keeps_the_manifest_parseable(
    committed: dict[int, int], epoch: int, step: int, keep: int
) -> None:
    fence = max(committed.values(), default=0)
    before = _manifest(*(_entry(s, e) for s, e in committed.items()), fence=fence)
    entry = _entry(step, epoch)

    try:
        updated, dropped = commit(before, entry, keep)
    except Fenced:
        assert epoch < fence
        return

    assert epoch >= fence
    if updated is None:
        assert step in committed
        return
    assert parse_run_manifest(updated.to_json()) == updated
    assert updated.fence == max(fence, epoch)
    assert len(updated.entries) <= keep
    assert {e.step for e in updated.entries} | {e.step for e in dropped} == {*committed, step}
