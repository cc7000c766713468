"""The commit protocol: how the sync sidecar makes a checkpoint in the bucket committed, and the
probe of what the endpoint can do for it.

A checkpoint is committed when, and only when, its step is in the run's ``manifest.json``; the
operator and ``trainingrun restore`` trust nothing else. For each checkpoint the sidecar:

1. uploads every file with a full-object checksum the endpoint checks (``trainingrun.transfer``);
2. verifies each object's size and stored checksum (``verify_uploaded``);
3. writes ``checkpoints/checkpoint-<step>/MANIFEST.json`` create-only
   (``Committer.write_checkpoint_manifest``): an identical one left by an earlier attempt is kept,
   another of a step not committed is replaced (If-Match on the version read), another of a
   committed step is refused (a second writer is active);
4. adds the step to ``manifest.json`` by compare-and-swap (``Committer.commit``: If-Match, or
   If-None-Match for the first commit; re-read and retried with jitter on 412). Only now is the
   step committed;
5. applies retention (``keep``): the manifest drops old entries first, their objects go after
   (``Committer.delete_checkpoint_objects``), so no entry ever names deleted objects.

Before the first, ``detect_capabilities`` probes the endpoint with tiny objects: which checksum it
accepts and whether it checks it, and whether it honours If-None-Match. Without conditional
writes, step 4 writes and reads back instead: safe with one writer per run, which the operator
guarantees.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass

from trainingrun import checksum
from trainingrun.checksum import Algorithm
from trainingrun.local import LocalCheckpoint
from trainingrun.manifest import (
    CHECKPOINT_MANIFEST,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    ManifestError,
    RunManifest,
    checkpoint_prefix,
    parse_checkpoint_manifest,
    parse_run_manifest,
    same_files,
    with_committed,
)
from trainingrun.storage import (
    ChecksumMismatch,
    Location,
    PreconditionFailed,
    StorageError,
    StorageRejected,
    StorageUnavailable,
    Store,
)
from trainingrun.transfer import FileChanged, VerificationFailed

# The sidecar's logger: this runs inside it, and its log names the process, not the module.
log = logging.getLogger("trainingrun.sync")

CAS_ATTEMPTS = 20


# ---------------------------------------------------------------------------------------------
# What the endpoint can do


@dataclass(frozen=True)
class Capabilities:
    algorithm: Algorithm
    verifies_checksums: bool
    conditional_writes: bool

    def describe(self) -> str:
        return (
            f"checksum {self.algorithm.name} "
            f"({'checked' if self.verifies_checksums else 'NOT checked'} by the endpoint), "
            f"conditional writes {'yes' if self.conditional_writes else 'no'}"
        )


def detect_capabilities(store: Store, run: Location, wanted: str = "auto") -> Capabilities:
    """Probes the endpoint with a few tiny objects under the run's prefix: which checksum it
    accepts and checks, and whether it honours If-None-Match. The probe objects are removed."""
    probe = run.key(".trainingrun-probe", uuid.uuid4().hex)
    names = checksum.PREFERENCE if wanted == "auto" else (checksum.algorithm(wanted).name,)
    data = b"trainingrun capability probe"
    chosen: Algorithm | None = None
    verifies = False
    try:
        for name in names:
            algo = checksum.ALGORITHMS[name]
            try:
                store.put_checked(probe, data, algo.header, checksum.digest(algo, data))
            except StorageRejected:
                log.info("endpoint refuses %s checksums", name)
                continue
            chosen = algo
            wrong = checksum.digest(algo, data + b"!")
            try:
                store.put_checked(probe, data, algo.header, wrong)
            except ChecksumMismatch:
                verifies = True
            except StorageRejected:
                verifies = True  # refused, which is what matters
            break
        if chosen is None:
            raise StorageRejected(
                f"the endpoint accepts none of the checksum algorithms {', '.join(names)}; "
                "set TRAININGRUN_CHECKSUM to one it supports"
            )
        cond_key = probe + "-cond"
        store.put(cond_key, b"1", if_none_match=True)
        try:
            store.put(cond_key, b"2", if_none_match=True)
            conditional = False
        except PreconditionFailed:
            conditional = True
        except StorageRejected:
            conditional = False
    finally:
        with contextlib.suppress(StorageError):
            store.delete([probe, probe + "-cond"])
    return Capabilities(chosen, verifies, conditional)


# ---------------------------------------------------------------------------------------------
# Verifying and committing


def verify_uploaded(
    store: Store, ckpt: LocalCheckpoint, prefix: str, algo: Algorithm, sums: dict[str, str]
) -> list[FileEntry]:
    """The MANIFEST.json entries of an uploaded checkpoint, once every object is there with the
    size we read and, where the endpoint stores it, our checksum. A file whose size changed since
    the scan is still being written (FileChanged); a wrong object is VerificationFailed."""
    entries = []
    for rel, size in ckpt.files:
        key = f"{prefix}/{rel}"
        if (ckpt.path / rel).stat().st_size != size:
            raise FileChanged(f"{ckpt.path / rel} changed size during the upload")
        head = store.head(key, algo.header)
        if head is None or head[0] != size:
            raise VerificationFailed(f"{key}: expected {size} bytes, found {head and head[0]}")
        if head[1] is not None and head[1] != sums[key]:
            raise VerificationFailed(f"{key}: stored checksum {head[1]} != ours {sums[key]}")
        entries.append(
            FileEntry(path=rel, size=size, checksum_algorithm=algo.name, checksum=sums[key])
        )
    return entries


class Committer:
    """Writes a checkpoint's MANIFEST.json and commits it to manifest.json."""

    def __init__(self, store: Store, run: Location, caps: Capabilities, keep: int) -> None:
        self.store = store
        self.run = run
        self.caps = caps
        self.keep = keep

    def read(self) -> tuple[RunManifest | None, str | None]:
        got = self.store.get_with_etag(self.run.key(RUN_MANIFEST))
        if got is None:
            return None, None
        return parse_run_manifest(got[0]), got[1]

    def write_checkpoint_manifest(self, ckpt: CheckpointManifest) -> None:
        key = self.run.key(checkpoint_prefix(ckpt.step), CHECKPOINT_MANIFEST)
        body = ckpt.model_dump_json(indent=1).encode()
        try:
            self.store.put(key, body, if_none_match=self.caps.conditional_writes)
            return
        except PreconditionFailed:
            pass
        # One exists: left by an earlier attempt or a sync killed before its commit.
        existing = self.store.get_with_etag(key)
        if existing is not None:
            try:
                if same_files(parse_checkpoint_manifest(existing[0], ckpt.step), ckpt):
                    return
            except ManifestError:
                pass
            manifest, _ = self.read()
            if manifest and any(e.step == ckpt.step for e in manifest.entries):
                raise PreconditionFailed(
                    f"checkpoint-{ckpt.step} is already committed with other contents; "
                    "a second writer is active for this run"
                )
            # Not committed, so nobody trusts it: replace it, but only the version we read.
            self.store.put(key, body, if_match=existing[1])
        else:
            self.store.put(key, body, if_none_match=True)

    def commit(self, entry: ManifestEntry) -> list[ManifestEntry]:
        """Adds ``entry`` by compare-and-swap; returns the entries retention dropped."""
        key = self.run.key(RUN_MANIFEST)
        for attempt in range(CAS_ATTEMPTS):
            manifest, etag = self.read()
            updated, dropped = with_committed(manifest, entry, self.keep)
            try:
                if not self.caps.conditional_writes:
                    self.store.put(key, updated.to_json())
                    check, _ = self.read()  # best effort without CAS: confirm it stuck
                    if check is None or all(e.step != entry.step for e in check.entries):
                        raise PreconditionFailed(f"{key}: a concurrent write replaced ours")
                elif etag is None:
                    self.store.put(key, updated.to_json(), if_none_match=True)
                else:
                    self.store.put(key, updated.to_json(), if_match=etag)
                return dropped
            except PreconditionFailed:
                time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))  # noqa: S311
        raise StorageUnavailable(
            f"{key}: still losing the compare-and-swap after {CAS_ATTEMPTS} tries"
        )

    def delete_checkpoint_objects(self, steps: list[int]) -> int:
        """Deletes the objects of dropped steps, after the manifest no longer names them."""
        keys: list[str] = []
        for step in steps:
            keys.extend(
                k for k, _ in self.store.list_objects(self.run.key(checkpoint_prefix(step)) + "/")
            )
        if keys:
            self.store.delete(keys)
        return len(keys)
