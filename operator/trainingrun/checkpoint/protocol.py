"""The fenced, rank-aware commit protocol's decisions, pure: who may commit, what a commit
writes, which objects may be deleted and which unfinished uploads aborted.

- **Fence.** ``manifest.json`` holds ``fence``, an epoch that only grows, and ``fence_holder``,
  the attempt holding it (``<run uid>/<attempt>``). Before it creates an attempt's pods the
  operator takes the fence for that attempt (``take_fence``: the next epoch, by
  compare-and-swap); the pods' sidecars write under that epoch's keys and commit only while the
  fence is still their epoch (``commit``, checked in the compare-and-swap that commits). An
  attempt of an older epoch can neither commit nor touch what another epoch wrote: its keys are
  its own. The epoch, not the attempt number, names the keys: a run deleted and created again
  under the same name starts again at attempt 1, and its epochs continue from the bucket's.
- **Parts.** A checkpoint written by R ranks is committed once, when the parts of all R ranks of
  one epoch are there (``missing_ranks``); parts of two epochs never mix (their keys differ).
- **Deletion.** ``sweepable`` picks what a committer may delete after its commit: the objects of
  entries retention dropped, and what older epochs left uncommitted. Never an object of a
  committed entry, of the committer's own epoch in flight, or of a newer epoch.
"""

from __future__ import annotations

import re

from trainingrun.checkpoint.manifest import (
    CHECKPOINTS_DIR,
    MANIFEST_VERSION,
    CheckpointManifest,
    FileEntry,
    Layout,
    ManifestEntry,
    ManifestError,
    RunManifest,
)


class Fenced(Exception):
    """A newer epoch holds the run's fence: this attempt must not commit, and should stop."""

    def __init__(self, epoch: int, fence: int, holder: str) -> None:
        super().__init__(
            f"epoch {epoch} is fenced: epoch {fence} ({holder or 'unknown holder'}) holds the run "
            "now; this is an old attempt's writer, and nothing it writes will be committed"
        )
        self.epoch, self.fence, self.holder = epoch, fence, holder


class StaleAttempt(Exception):
    """A later attempt of the same run already holds the fence: the caller's view is stale."""


def holder_of(run_uid: str, attempt: int) -> str:
    return f"{run_uid}/{attempt}"


def take_fence(
    manifest: RunManifest | None, run_uid: str, attempt: int
) -> tuple[RunManifest | None, int]:
    """(the manifest to write, or None when it needs no write; the attempt's epoch). Taking it
    again for the same attempt gives the same epoch, so a retried pass is harmless; a version-1
    manifest is written back as version 2 with its entries as they are."""
    before = manifest or RunManifest(version=MANIFEST_VERSION)
    mine = holder_of(run_uid, attempt)
    if before.fence_holder == mine and before.fence:  # only a manifest read can hold it
        if before.version == MANIFEST_VERSION:
            return None, before.fence
        return before.model_copy(update={"version": MANIFEST_VERSION}), before.fence
    held_uid, _, held_attempt = before.fence_holder.rpartition("/")
    if held_uid == run_uid and held_attempt.isdigit() and int(held_attempt) > attempt:
        raise StaleAttempt(
            f"attempt {held_attempt} of this run already holds the fence; attempt {attempt} "
            "is not the newest"
        )
    epoch = before.fence + 1
    update = {"version": MANIFEST_VERSION, "fence": epoch, "fence_holder": mine}
    return before.model_copy(update=update), epoch


def commit(
    manifest: RunManifest | None, entry: ManifestEntry, keep: int
) -> tuple[RunManifest | None, list[ManifestEntry]]:
    """(the manifest to write, or None when the step is committed already; the entries
    retention dropped). Raises Fenced when a newer epoch holds the fence. A committer whose
    epoch is ahead of the fence (the fence was never taken, e.g. a sync run by hand) raises it
    to its own epoch in the same write."""
    fence = manifest.fence if manifest else 0
    if entry.epoch < fence:
        raise Fenced(entry.epoch, fence, manifest.fence_holder if manifest else "")
    if manifest is not None and any(e.step == entry.step for e in manifest.entries):
        return None, []
    updated, dropped = with_committed(manifest, entry, keep)
    if entry.epoch > fence:
        updated = updated.model_copy(update={"fence": entry.epoch, "fence_holder": ""})
    return updated, dropped


def missing_ranks(parts: dict[int, CheckpointManifest], ranks: int) -> list[int]:
    """The ranks whose part of the checkpoint is not there yet."""
    return [r for r in range(ranks) if r not in parts]


def merged_files(parts: list[tuple[str, CheckpointManifest]]) -> list[tuple[str, FileEntry]]:
    """(key relative to the run prefix of the object holding its bytes, file) of every file of
    a checkpoint's parts, given as (part prefix, part manifest): what a restore puts in one
    folder; a packed file's key is its pack's. A path in two parts is
    kept once when both have the same bytes; with different bytes the checkpoint cannot be put
    together and ManifestError names both ranks."""
    seen: dict[str, tuple[int, FileEntry]] = {}
    out: list[tuple[str, FileEntry]] = []
    for prefix, part in parts:
        for f in part.files:
            other = seen.get(f.path)
            if other is None:
                seen[f.path] = (part.rank, f)
                out.append((prefix + f.source, f))
            elif (other[1].size, other[1].checksum) != (f.size, f.checksum):
                raise ManifestError(
                    f"checkpoint-{part.step}: ranks {other[0]} and {part.rank} both wrote "
                    f"{f.path} with different contents; one folder cannot hold both"
                )
    return out


_KEY = re.compile(
    rf"^{CHECKPOINTS_DIR}/checkpoint-(?P<step>\d+)/(?:e(?P<epoch>\d+)/(?:r(?P<rank>\d+)/)?)?"
)


_MAX_DIGITS = len(str(2**63 - 1))


def key_owner(key: str) -> tuple[int, int, int | None] | None:
    """(step, epoch, rank) of an object key relative to the run prefix: epoch 0 for a version-1
    checkpoint's files, rank None for a key directly in an epoch folder; None for keys outside
    ``checkpoints/`` or with a number of more digits than a 64-bit one."""
    m = _KEY.match(key)
    # A number past 64 bits is no writer's (and past 4300 digits int() would raise).
    if m is None or any(len(n) > _MAX_DIGITS for n in m.groups() if n):
        return None
    epoch = m.group("epoch")
    rank = m.group("rank")
    return int(m.group("step")), int(epoch) if epoch else 0, int(rank) if rank else None


def sweepable(
    keys: list[str], manifest: RunManifest, epoch: int, dropped: list[ManifestEntry]
) -> list[str]:
    """The keys (relative to the run prefix) a committer of ``epoch`` may delete right after
    writing ``manifest``: those of the entries retention ``dropped``, and those of older epochs
    that no entry names. Not the committer's own epoch in flight (other ranks may be writing),
    not a newer epoch's, never a committed entry's."""
    committed = {(e.step, e.epoch) for e in manifest.entries}
    gone = {(d.step, d.epoch) for d in dropped} - committed
    out = []
    for key in keys:
        owner = key_owner(key)
        if owner is None:
            continue
        group = owner[:2]
        # A version-1 checkpoint's files may sit in folders that look like epochs: all of a
        # committed version-1 step's keys are its own.
        if group in committed or (owner[0], 0) in committed:
            continue
        if group in gone or owner[1] < epoch:
            out.append(key)
    return out


def abortable(key: str, epoch: int, rank: int) -> bool:
    """Whether a sidecar of (``epoch``, ``rank``) may abort an unfinished multipart upload to
    ``key`` (relative to the run prefix) at its start: one an older epoch left, or one its own
    (epoch, rank) left before a restart. Never another rank's or a newer epoch's in flight."""
    owner = key_owner(key)
    if owner is None:
        return False
    return owner[1] < epoch or (owner[1] == epoch and owner[2] == rank)


def candidates(manifest: RunManifest, bad_steps: set[int] | frozenset[int]) -> list[ManifestEntry]:
    """Committed entries to try, newest first, skipping steps recorded as bad."""
    return sorted(
        (e for e in manifest.entries if e.step not in bad_steps),
        key=lambda e: e.step,
        reverse=True,
    )


def with_committed(
    manifest: RunManifest | None, entry: ManifestEntry, keep: int
) -> tuple[RunManifest, list[ManifestEntry]]:
    """The manifest (version 2) after committing ``entry`` and keeping the newest ``keep`` steps,
    and the entries retention dropped (their objects may be deleted once the new manifest is
    written). A step is committed once: committing one that is already there changes nothing.
    The fence is the caller's to check (``trainingrun.checkpoint.protocol.commit``)."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    before = manifest or RunManifest()
    if any(e.step == entry.step for e in before.entries):
        return before.model_copy(update={"version": MANIFEST_VERSION}), []
    entries = sorted([*before.entries, entry], key=lambda e: e.step)
    kept, dropped = entries[-keep:], entries[:-keep]
    updated = before.model_copy(update={"version": MANIFEST_VERSION, "entries": kept})
    return updated, dropped


def worth_uploading(step: int, committed: list[int], keep: int) -> bool:
    """False for a step retention would drop at once: ``keep`` newer steps are committed."""
    return step not in committed and sum(1 for s in committed if s > step) < keep


def merged_layout(layouts: list[Layout | None]) -> Layout | None:
    """The layout of a checkpoint from its parts' (rank 0 first): rank 0's folder and resume
    path, every rank's extra files (each rank's pointer file lives in its own folder)."""
    first = layouts[0] if layouts else None
    if first is None:
        return None
    extras: dict[str, str] = {}
    for layout in reversed(layouts):
        if layout is not None:
            extras.update(layout.extras)
    return first.model_copy(update={"extras": extras})


def same_files(a: CheckpointManifest, b: CheckpointManifest) -> bool:
    """Both describe the same bytes (creation time aside)."""

    def key(m: CheckpointManifest) -> list[tuple[str, int, str, str, str, int]]:
        return sorted(
            (f.path, f.size, f.checksum_algorithm, f.checksum, f.source, f.offset) for f in m.files
        )

    same_part = (a.step, a.epoch, a.rank, a.ranks) == (b.step, b.epoch, b.rank, b.ranks)
    return same_part and a.layout == b.layout and key(a) == key(b)
