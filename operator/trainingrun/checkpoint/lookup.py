"""Reading what is committed: the run manifest, a checkpoint's parts, and the choice of the
checkpoint to resume from. Used by the operator, the restore, the user commands and the
committer; reads only what a committed entry names (its parts, rank by rank), within the caps
of ``trainingrun.checkpoint.capped``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from trainingrun.checkpoint.manifest import (
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
from trainingrun.checkpoint.protocol import candidates, merged_files
from trainingrun.storage.opener import Location, StorageUnavailable, Store, TooLarge


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


# Objects a part's folder may list beyond the ones its MANIFEST.json names (the record itself,
# and room to spare) before its listing is given up: an endpoint can list without end.
LISTING_MARGIN = 64
# How long a choice of checkpoint may go on reading. Each call is bounded by the store's own
# budget (the operator's: storage.base.OPERATOR_BUDGET); this bounds their sum, which an endpoint
# that answers each call just in time would otherwise make hours (a part read and a listing
# per rank, 1024 ranks, each of the tried checkpoints).
CHOOSE_SECONDS = 120.0


class ReadsTooSlow(StorageUnavailable):
    """A choice of checkpoint read for longer than it may; the start tries again later."""


class _Timed:
    """The reads of a choice of checkpoint, each refused (ReadsTooSlow) once ``seconds`` have
    passed since the choice began; a listing is checked at each object it lists."""

    def __init__(self, store: Store, seconds: float, monotonic: Callable[[], float]) -> None:
        self._store, self._seconds, self._monotonic = store, seconds, monotonic
        self._until = monotonic() + seconds

    def _go_on(self) -> None:
        if self._monotonic() >= self._until:
            raise ReadsTooSlow(
                f"reading the committed checkpoints took over {self._seconds:g} s, the most a "
                "start may: the endpoint answers too slowly; the start is tried again later"
            )

    def get(self, key: str) -> bytes | None:
        self._go_on()
        return self._store.get(key)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        self._go_on()
        for listed in self._store.list_objects(prefix):
            self._go_on()
            yield listed


@dataclass(frozen=True)
class Choice:
    entry: ManifestEntry | None
    checkpoint: Committed | None
    rejected: list[tuple[int, str]]  # (step, why) of newer committed entries passed over
    untried: int = 0  # older candidates not tried: the choice stopped at its tries


_UNREAD = RunManifest(version=-1)


def choose_checkpoint(
    store: Store,
    run: Location,
    bad_steps: set[int],
    manifest: RunManifest | None = _UNREAD,
    *,
    tries: int | None = None,
    seconds: float = CHOOSE_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> Choice:
    """The newest committed checkpoint not marked bad whose objects exist with the recorded
    sizes; older committed entries are tried in turn, at most ``tries`` of them (None: all).
    ``manifest``: one the caller just read. Raises ReadsTooSlow once it has read for
    ``seconds``, and what the store raises."""
    timed = cast(Store, _Timed(store, seconds, monotonic))
    if manifest is _UNREAD:
        manifest = read_run_manifest(timed, run)
    if manifest is None:
        return Choice(None, None, [])
    rejected: list[tuple[int, str]] = []
    entries = candidates(manifest, bad_steps)
    for entry in entries if tries is None else entries[:tries]:
        ckpt, why = check_committed(timed, run, entry)
        if ckpt is not None:
            return Choice(entry, ckpt, rejected)
        rejected.append((entry.step, why or "not intact"))
    return Choice(None, None, rejected, len(entries) - len(rejected))


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
        listing = _listing(store, run, prefix, part)
        if isinstance(listing, str):
            return None, listing
        problems.extend(listing_problems(part, listing))
    if problems:
        return None, "; ".join(problems[:3])
    return ckpt, None


def _listing(
    store: Store, run: Location, prefix: str, part: CheckpointManifest
) -> dict[str, int] | str:
    """(name relative to the part's folder -> size) of the objects ``part`` names that its
    folder lists, read until all are found; or why the listing was given up: it went on past
    the objects named plus LISTING_MARGIN without them."""
    named = {f.source for f in part.files}
    found: dict[str, int] = {}
    if not named:
        return found
    where = run.key(prefix) + "/"
    bound = len(named) + LISTING_MARGIN
    for count, (key, size) in enumerate(store.list_objects(where), 1):
        if count > bound:
            return (
                f"{prefix} lists more than {bound} objects without the {len(named)} its "
                f"{CHECKPOINT_MANIFEST} names: remove what is not the checkpoint's from its folder"
            )
        name = key[len(where) :]
        if key.startswith(where) and name in named:
            found[name] = size
            if len(found) == len(named):
                break
    return found
