"""Reading what is committed: the run manifest, a checkpoint's parts, and the choice of the
checkpoint to resume from. Used by the operator, the restore, the user commands and the
committer; reads only what a committed entry names (its parts, rank by rank), within the caps
of ``trainingrun.capped``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainingrun.manifest import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_MANIFEST_MAX_BYTES,
    MAX_CHECKPOINT_FILES,
    MAX_CHECKPOINT_RECORD_BYTES,
    RUN_MANIFEST,
    RUN_MANIFEST_MAX_BYTES,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    ManifestError,
    RunManifest,
    checkpoint_prefix,
    listing_problems,
    parse_checkpoint_manifest,
    parse_run_manifest,
    part_prefix,
    too_large,
)
from trainingrun.protocol import candidates, merged_files
from trainingrun.storage import Location, Store, TooLarge


def _read(store: Store, run: Location, what: str, cap: int) -> bytes | None:
    """The bytes of the manifest ``what`` (relative to the run), None when it does not exist.
    The store reads no more than its ``max_get_bytes``; the parsers hold each manifest to its
    own cap. ManifestTooLarge, naming the object, when it is over the store's."""
    try:
        return store.get(run.key(what))
    except TooLarge as e:
        raise too_large(f"s3://{run.bucket}/{run.key(what)}", e.size, cap) from e


def read_run_manifest_tagged(
    store: Store, run: Location
) -> tuple[RunManifest | None, tuple[bytes, str] | None]:
    """The run's manifest and its bytes with their ETag, as ``take_fence`` takes them (``seen``);
    (None, None) when there is none yet. Raises as read_run_manifest."""
    key = run.key(RUN_MANIFEST)
    try:
        got = store.get_with_etag(key)
    except TooLarge as e:
        raise too_large(f"s3://{run.bucket}/{key}", e.size, RUN_MANIFEST_MAX_BYTES) from e
    return (parse_run_manifest(got[0]), got) if got is not None else (None, None)


def read_run_manifest(store: Store, run: Location) -> RunManifest | None:
    """The run's manifest, None when there is none yet. Raises ManifestError (ManifestTooLarge
    past RUN_MANIFEST_MAX_BYTES or MAX_ENTRIES)."""
    data = _read(store, run, RUN_MANIFEST, RUN_MANIFEST_MAX_BYTES)
    return parse_run_manifest(data) if data is not None else None


def read_part(
    store: Store, run: Location, step: int, epoch: int, rank: int
) -> CheckpointManifest | None:
    """One rank's part record, None when it is not there. Raises ManifestError
    (ManifestTooLarge past CHECKPOINT_MANIFEST_MAX_BYTES or MAX_FILES)."""
    what = part_prefix(step, epoch, rank) + CHECKPOINT_MANIFEST
    data = _read(store, run, what, CHECKPOINT_MANIFEST_MAX_BYTES)
    return parse_checkpoint_manifest(data, step, epoch, rank) if data is not None else None


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint as its parts describe it."""

    entry: ManifestEntry
    parts: list[tuple[str, CheckpointManifest]]  # (part prefix relative to the run, record)
    files: list[tuple[str, FileEntry]]  # (key relative to the run prefix, file), all ranks'

    @property
    def total_bytes(self) -> int:
        return sum(f.size for _, f in self.files)


def read_committed(store: Store, run: Location, entry: ManifestEntry) -> Committed:
    """The parts of a committed entry and the files they hold together. Raises ManifestError
    naming a part that is missing or malformed, or two ranks that wrote one path with
    different bytes; ManifestTooLarge once its parts hold more than MAX_CHECKPOINT_FILES files
    or MAX_CHECKPOINT_RECORD_BYTES of records, before the next part is read."""
    if entry.files > MAX_CHECKPOINT_FILES:
        raise too_large(checkpoint_prefix(entry.step), entry.files, MAX_CHECKPOINT_FILES, "files")
    parts = []
    files = record_bytes = 0
    for rank in range(entry.ranks):  # at most MAX_RANKS: the manifest's parse held it
        prefix = part_prefix(entry.step, entry.epoch, rank)
        what = prefix + CHECKPOINT_MANIFEST
        data = _read(store, run, what, CHECKPOINT_MANIFEST_MAX_BYTES)
        if data is None:
            raise ManifestError(f"{what} is missing")
        record_bytes += len(data)
        if record_bytes > MAX_CHECKPOINT_RECORD_BYTES:
            raise too_large(f"the part records up to {what}", None, MAX_CHECKPOINT_RECORD_BYTES)
        part = parse_checkpoint_manifest(data, entry.step, entry.epoch, rank)
        files += len(part.files)
        if files > MAX_CHECKPOINT_FILES:
            raise too_large(f"the parts up to {what}", files, MAX_CHECKPOINT_FILES, "files")
        parts.append((prefix, part))
    return Committed(entry, parts, merged_files(parts))


@dataclass(frozen=True)
class Choice:
    entry: ManifestEntry | None
    checkpoint: Committed | None
    rejected: list[tuple[int, str]]  # (step, why) of newer committed entries passed over


_UNREAD = RunManifest(version=-1)


def choose_checkpoint(
    store: Store, run: Location, bad_steps: set[int], manifest: RunManifest | None = _UNREAD
) -> Choice:
    """The newest committed checkpoint not marked bad whose objects exist with the recorded sizes;
    older committed entries are tried in turn. ``manifest``: one the caller just read."""
    if manifest is _UNREAD:
        manifest = read_run_manifest(store, run)
    if manifest is None:
        return Choice(None, None, [])
    rejected: list[tuple[int, str]] = []
    for entry in candidates(manifest, bad_steps):
        ckpt, why = check_committed(store, run, entry)
        if ckpt is not None:
            return Choice(entry, ckpt, rejected)
        rejected.append((entry.step, why or "not intact"))
    return Choice(None, None, rejected)


def check_committed(
    store: Store, run: Location, entry: ManifestEntry
) -> tuple[Committed | None, str | None]:
    """(its parts, None) when a committed entry is intact: every part's MANIFEST.json parses, is
    of this step, epoch and rank, and every object it names exists with the recorded size; else
    (None, why)."""
    try:
        ckpt = read_committed(store, run, entry)
    except ManifestError as e:
        return None, str(e)
    problems: list[str] = []
    for prefix, part in ckpt.parts:
        where = run.key(prefix) + "/"
        listing = {key[len(where) :]: size for key, size in store.list_objects(where)}
        problems.extend(listing_problems(part, listing))
    if problems:
        return None, "; ".join(problems[:3])
    return ckpt, None
