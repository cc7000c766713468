"""Decoding the records a tenant's bucket holds under caps: every reader of ``manifest.json``
and of a part's ``MANIFEST.json`` (``trainingrun.checkpoint.manifest``) goes through ``decode``,
which
refuses a record over its caps before it is decoded, and names the problem and the fix.

The operator reads every tenant's manifests, which anyone with write access to a bucket can
make: a 23 MiB manifest.json once took 245 MiB of the operator's memory, and a 186-byte one
naming a hundred million ranks ~9 GiB. This module is pure and imports nothing of the package.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from trainingrun.contract import MAX_REPLICAS

RUN_MANIFEST = "manifest.json"

# Caps on what a reader takes. The sidecar writes about half a KiB per kept checkpoint to
# manifest.json and about 150 bytes per file to a MANIFEST.json.
RUN_MANIFEST_MAX_BYTES = 4 << 20
CHECKPOINT_MANIFEST_MAX_BYTES = 8 << 20
MAX_ENTRIES = 1000  # checkpoints in manifest.json: spec.checkpoint.keep is at most 1000
MAX_FILES = 10_000  # files in one rank's part of a checkpoint
MAX_NAME_BYTES = 255  # a file's path in a checkpoint, UTF-8
# Ranks of a checkpoint: the most spec.replicas allows. A reader builds one key per rank.
MAX_RANKS = MAX_REPLICAS
# What the parts of one checkpoint may hold together: the files and part records of two full
# parts. A parsed file takes ~1.4 KiB of memory and a few microseconds of CPU, so a reader holds
# at most ~28 MiB of them, and reads at most 16 MiB of records, however many ranks it names.
MAX_CHECKPOINT_FILES = 2 * MAX_FILES
MAX_CHECKPOINT_RECORD_BYTES = 2 * CHECKPOINT_MANIFEST_MAX_BYTES
# Decoded, a byte of JSON can take 25 bytes of memory (a list of {}), so before decoding the
# values are counted (commas and brackets; those inside names count too, hence the room):
# a file has 5, an entry about 13 and its layout's extra files.
VALUES_PER_FILE, VALUES_PER_ENTRY = 8, 48


class ManifestError(ValueError):
    """A manifest that cannot be trusted; the message names the problem and the fix."""


class ManifestTooLarge(ManifestError):
    """A manifest over a reader's cap (bytes, checkpoints listed, files of a part): ``what``
    names it, and it is over ``cap`` ``unit``; messages that may not quote what the endpoint
    said take these, not the message."""

    def __init__(self, message: str, what: str = "", cap: int = 0, unit: str = "bytes") -> None:
        super().__init__(message)
        self.what, self.cap, self.unit = what, cap, unit


class ManifestTooNew(ManifestError):
    """A manifest of a version newer than this build reads: ``what`` names it, ``newest`` is
    the newest this build reads."""

    def __init__(self, message: str, what: str, newest: int) -> None:
        super().__init__(message)
        self.what, self.newest = what, newest


def too_large(what: str, size: int | None, cap: int, unit: str = "bytes") -> ManifestTooLarge:
    """The error for a manifest of ``size`` (None: unknown) over ``cap``, with the fix."""
    told = f"{size} {unit}" if size is not None else "larger"
    message = f"{what} is {told}, over the cap of {cap} {unit}: {fix(what)}"
    return ManifestTooLarge(message, what, cap, unit)


def fix(what: str) -> str:
    """What to do about a manifest over its cap; ``what`` is its key or its name."""
    if posixpath.basename(what) == RUN_MANIFEST:
        return (
            "the sync sidecar keeps it to about half a KiB per kept checkpoint (at most 1000), "
            "so something else wrote it: put back a good copy (the bucket's object versions) "
            "and find who writes to the run's prefix"
        )
    return "this checkpoint cannot be used; save fewer files per rank (larger shards)"


@dataclass(frozen=True)
class Caps:
    """What one kind of manifest may hold: bytes, and items of its list ``field``."""

    max_bytes: int
    field: str
    noun: str
    max_items: int
    values_per_item: int
    newest: int  # the newest version this build reads


def _check_caps(data: bytes, what: str, caps: Caps) -> None:
    """ManifestTooLarge before decoding when ``data`` is over the byte cap, or holds more values
    than ``max_items`` items can have; the exact count is checked once decoded."""
    if len(data) > caps.max_bytes:
        raise too_large(what, len(data), caps.max_bytes)
    values = data.count(b",") + data.count(b"{") + data.count(b"[")
    if values > caps.max_items * caps.values_per_item + 64:
        raise _too_many(what, caps, None)


def _too_many(what: str, caps: Caps, count: int | None) -> ManifestTooLarge:
    """The error for a manifest listing ``count`` items (None: too many values to decode)."""
    if count is None:
        listed = f"holds more JSON values than {caps.max_items} {caps.noun} can have"
    else:
        listed = f"lists {count} {caps.noun}, over the cap of {caps.max_items}"
    return ManifestTooLarge(f"{what} {listed}: {fix(what)}", what, caps.max_items, caps.noun)


def decode(data: bytes, what: str, caps: Caps) -> dict[str, Any]:
    """The JSON object of the manifest ``what`` (its name, in messages), of a version this build
    reads and within ``caps``. Raises ManifestError (ManifestTooLarge)."""
    _check_caps(data, what, caps)
    try:
        raw = json.loads(data)
    # ValueError also covers integers past Python's digit limit; RecursionError, deep nesting.
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"{what} is not valid JSON ({e}); it was not written by sync") from e
    if not isinstance(raw, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(raw).__name__}")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ManifestError(f"{what} has no positive integer 'version'")
    if version > caps.newest:
        raise ManifestTooNew(
            f"{what} has version {version}, newer than the {caps.newest} this build reads: "
            "upgrade the operator and agent images",
            what,
            caps.newest,
        )
    items = raw.get(caps.field)
    if isinstance(items, list) and len(items) > caps.max_items:
        raise _too_many(what, caps, len(items))
    return raw
