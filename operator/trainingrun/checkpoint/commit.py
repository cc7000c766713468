"""The commit protocol's writes: how an attempt takes the fence, how a sync sidecar makes a
checkpoint committed, and the probe of what the endpoint can do for it. The decisions are pure,
in ``trainingrun.checkpoint.protocol``.

A checkpoint is committed when, and only when, its step is in the run's ``manifest.json``; the
operator and ``trainingrun restore`` trust nothing else. Before an attempt's pods exist the
operator takes the fence for it (``take_fence``), which gives the attempt its epoch. Then, for
each checkpoint, the sidecar of each rank:

1. uploads every file under ``checkpoints/checkpoint-<step>/e<epoch>/r<rank>/``, keys no other
   attempt or rank writes, with a full-object checksum the endpoint checks;
2. verifies each object's size and stored checksum (``transfer.verify_uploaded``);
3. writes its part record ``.../r<rank>/MANIFEST.json`` create-only (``Committer.write_part``);
4. when the parts of all ranks of its epoch are there, adds the step to ``manifest.json`` by
   compare-and-swap (``Committer.try_commit``: If-Match, or If-None-Match for the first write;
   re-read and retried with jitter on 412), only while the fence is still its epoch. Only now is
   the step committed, once: a step already committed stays as it is;
5. deletes what retention dropped and what older epochs left uncommitted (``Committer.sweep``),
   after the manifest no longer names it.

``detect_capabilities`` probes the endpoint with tiny objects first: which checksum it accepts
and checks, whether it honours If-None-Match and, where it does, If-Match. Without conditional
writes, step 3 is written plainly and the writes of step 4 and of the fence are read back
(docs/checkpoints.md says what then holds: no committed object is ever overwritten, keys being
per epoch). An endpoint that honours If-None-Match but ignores If-Match would let a commit
overwrite a newer fence unseen: the sidecar refuses to commit there (``trainingrun.agent.sync``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass

from trainingrun.checkpoint import protocol
from trainingrun.checkpoint.lookup import read_part, read_run_manifest
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    CHECKPOINTS_DIR,
    RUN_MANIFEST,
    CheckpointManifest,
    ManifestEntry,
    ManifestError,
    RunManifest,
    checkpoint_prefix,
    epoch_prefix,
    parse_checkpoint_manifest,
    parse_run_manifest,
    part_prefix,
    slowest,
)
from trainingrun.contract import now_rfc3339_micro
from trainingrun.storage import checksum
from trainingrun.storage.checksum import Algorithm
from trainingrun.storage.opener import (
    ChecksumMismatch,
    Location,
    PreconditionFailed,
    StorageError,
    StorageRejected,
    StorageUnavailable,
    Store,
)

# The sidecar's logger: this runs inside it, and its log names the process, not the module.
log = logging.getLogger("trainingrun.agent.sync")

CAS_ATTEMPTS = 20


# ---------------------------------------------------------------------------------------------
# What the endpoint can do


@dataclass(frozen=True)
class Capabilities:
    algorithm: Algorithm
    verifies_checksums: bool
    conditional_writes: bool  # If-None-Match honoured
    if_match: bool = True  # If-Match honoured (probed only where If-None-Match is)

    def describe(self) -> str:
        writes = "no"
        if self.conditional_writes:
            writes = "yes" if self.if_match else "If-None-Match only, If-Match ignored"
        return (
            f"checksum {self.algorithm.name} "
            f"({'checked' if self.verifies_checksums else 'NOT checked'} by the endpoint), "
            f"conditional writes {writes}"
        )


def detect_capabilities(store: Store, run: Location, wanted: str = "auto") -> Capabilities:
    """Probes the endpoint with a few tiny objects under the run's prefix: which checksum it
    accepts and checks, whether it honours If-None-Match and, where it does, If-Match (a write
    on ``PROBE_ETAG``, as the operator's fence probes). The probe objects are removed."""
    probe = run.key(".trainingrun-probe", uuid.uuid4().hex)
    names = checksum.PREFERENCE if wanted == "auto" else (checksum.algorithm(wanted).name,)
    data, verifies = b"trainingrun capability probe", False
    chosen: Algorithm | None = None
    try:
        for name in names:
            algo = checksum.ALGORITHMS[name]
            try:
                store.put_checked(probe, data, algo, checksum.digest(algo, data))
            except StorageRejected:
                log.info("endpoint refuses %s checksums", name)
                continue
            chosen = algo
            wrong = checksum.digest(algo, data + b"!")
            try:
                store.put_checked(probe, data, algo, wrong)
            except (ChecksumMismatch, StorageRejected):  # refused, which is what matters
                verifies = True
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
        if_match = conditional
        if conditional:  # a 412 on an ETag no object has; written, or refused: not usable
            try:
                store.put(cond_key, b"3", if_match=PROBE_ETAG)
                if_match = False
            except PreconditionFailed:
                pass
            except StorageRejected:
                if_match = False
    finally:
        with contextlib.suppress(StorageError):
            store.delete([probe, probe + "-cond"])
    return Capabilities(chosen, verifies, conditional, if_match)


# ---------------------------------------------------------------------------------------------
# Verifying and committing


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))  # noqa: S311


def _write_manifest(store: Store, key: str, body: bytes, etag: str | None, cas: bool) -> None:
    """One compare-and-swap of ``manifest.json`` (If-Match the version read, If-None-Match when
    none; PreconditionFailed when it lost), or a plain write (``cas`` False) the caller reads."""
    if not cas:
        store.put(key, body)
    elif etag is None:
        store.put(key, body, if_none_match=True)
    else:
        store.put(key, body, if_match=etag)


PROBE_ETAG = '"trainingrun-if-match-probe"'  # no object's: a 412 wherever If-Match is honoured


@dataclass
class IfMatch:
    """Whether an endpoint honours If-Match on ``manifest.json``; None: not found out yet."""

    honoured: bool | None = None


def take_fence(
    store: Store,
    run: Location,
    run_uid: str,
    attempt: int,
    seen: tuple[bytes, str] | None = None,
    if_match: IfMatch | None = None,
) -> tuple[RunManifest, int]:
    """Takes the run's fence for ``attempt`` (the operator, before the attempt's pods exist):
    (the manifest as written, the attempt's epoch). Idempotent for one attempt; a version-1
    manifest is upgraded. ``seen``: the manifest's bytes and ETag as just read, instead of a
    first read. Raises StaleAttempt, ManifestError, StorageError.
    The write is read back, unless ``if_match`` (the endpoint's) says If-Match is honoured and
    a manifest was replaced. The first such write finds out, If-Match ``PROBE_ETAG``: a 412
    writes nothing; where the condition is ignored, that write is the fence, read back."""
    key = run.key(RUN_MANIFEST)
    mine = protocol.holder_of(run_uid, attempt)
    for i in range(CAS_ATTEMPTS):
        got = seen if i == 0 and seen is not None else store.get_with_etag(key)
        manifest = parse_run_manifest(got[0]) if got else None
        updated, epoch = protocol.take_fence(manifest, run_uid, attempt)
        if updated is None:
            assert manifest is not None
            return manifest, epoch
        etag = got[1] if got else None
        body = updated.to_json()
        probe = if_match if etag is not None else None
        try:
            written = False
            if probe is not None and probe.honoured is None:
                with contextlib.suppress(PreconditionFailed):
                    store.put(key, body, if_match=PROBE_ETAG)
                    written = True  # the condition ignored: that was the fence, read back
                probe.honoured = not written
            if not written:
                _write_manifest(store, key, body, etag, cas=True)
        except PreconditionFailed:
            _backoff(i)
            continue
        except StorageRejected:  # refuses the condition headers: write, and read back below
            if probe is not None:
                probe.honoured = False
            _write_manifest(store, key, body, etag, cas=False)
        else:  # a compare-and-swap where If-Match is honoured: it took
            if probe is not None and probe.honoured:
                return updated, epoch
        check = read_run_manifest(store, run)  # an endpoint that ignores If-Match: confirm
        if check is not None and check.fence_holder == mine and check.fence == epoch:
            return check, epoch
        _backoff(i)
    raise StorageUnavailable(f"{key}: still losing the compare-and-swap after {CAS_ATTEMPTS} tries")


@dataclass(frozen=True)
class Outcome:
    """What ``try_commit`` did: committed now (with what retention dropped), found the step
    committed already (by ``epoch``), or waits for the parts of ``missing`` ranks."""

    committed: bool = False
    already: int | None = None
    missing: tuple[int, ...] = ()
    dropped: tuple[ManifestEntry, ...] = ()
    manifest: RunManifest | None = None


class Committer:
    """One rank's writer of one epoch: its part records, the commit, and the sweep after it."""

    def __init__(
        self,
        store: Store,
        run: Location,
        caps: Capabilities,
        keep: int,
        epoch: int,
        rank: int = 0,
        ranks: int = 1,
    ) -> None:
        if not (epoch >= 1 and 0 <= rank < ranks):
            raise ValueError(f"epoch {epoch} must be >= 1 and rank {rank} in 0..{ranks - 1}")
        self.store = store
        self.run = run
        self.caps = caps
        self.keep = keep
        self.epoch = epoch
        self.rank = rank
        self.ranks = ranks

    def read(self) -> tuple[RunManifest | None, str | None]:
        got = self.store.get_with_etag(self.run.key(RUN_MANIFEST))
        if got is None:
            return None, None
        return parse_run_manifest(got[0]), got[1]

    def data_prefix(self, step: int) -> str:
        """Where this rank's files of ``step`` go (a key, without the trailing '/')."""
        return self.run.key(part_prefix(step, self.epoch, self.rank))

    def check_fence(self, manifest: RunManifest | None) -> None:
        """Raises Fenced when a newer epoch holds the fence."""
        if manifest is not None and manifest.fence > self.epoch:
            raise protocol.Fenced(self.epoch, manifest.fence, manifest.fence_holder)

    def write_part(self, part: CheckpointManifest) -> None:
        """This rank's part record, create-only. Only this (epoch, rank) writes its key: an
        identical record (a restarted sidecar's) is kept, another of a step not committed is
        replaced (If-Match on the version read), another of a committed step is refused."""
        if (part.epoch, part.rank, part.ranks) != (self.epoch, self.rank, self.ranks):
            raise ValueError("the part record is not this committer's epoch and rank")
        key = self.run.key(part_prefix(part.step, self.epoch, self.rank), CHECKPOINT_MANIFEST)
        body = part.model_dump_json(indent=1).encode()
        try:
            self.store.put(key, body, if_none_match=self.caps.conditional_writes)
            return
        except PreconditionFailed:
            pass
        existing = self.store.get_with_etag(key)
        if existing is None:
            self.store.put(key, body, if_none_match=True)
            return
        try:
            parsed = parse_checkpoint_manifest(existing[0], part.step, self.epoch, self.rank)
            if protocol.same_files(parsed, part):
                return
        except ManifestError:
            pass
        manifest, _ = self.read()
        if manifest and any((e.step, e.epoch) == (part.step, self.epoch) for e in manifest.entries):
            raise PreconditionFailed(
                f"checkpoint-{part.step} is committed by this epoch with other contents; "
                f"a second writer of epoch {self.epoch} rank {self.rank} is active"
            )
        self.store.put(key, body, if_match=existing[1])

    def parts(self, step: int) -> dict[int, CheckpointManifest]:
        """The part records of ``step`` of this epoch that are there, by rank."""
        found = {}
        for rank in range(self.ranks):
            part = read_part(self.store, self.run, step, self.epoch, rank)
            if part is None:
                continue
            if part.ranks != self.ranks:
                raise ManifestError(
                    f"checkpoint-{step} rank {rank} of epoch {self.epoch} was written for "
                    f"{part.ranks} ranks, this writer has {self.ranks}: one epoch, one size"
                )
            found[rank] = part
        return found

    def try_commit(
        self,
        step: int,
        attempt: int = 0,
        read: tuple[RunManifest | None, str | None] | None = None,
    ) -> Outcome:
        """Commits ``step`` when all ranks' parts of this epoch are there, by compare-and-swap
        while the fence is this epoch. ``read``: the manifest and ETag the caller has just
        read, else it is read here. Raises Fenced, StorageError, ManifestError."""
        manifest, etag = read if read is not None else self.read()
        self.check_fence(manifest)
        done = next((e for e in manifest.entries if e.step == step), None) if manifest else None
        if done is not None:
            return Outcome(already=done.epoch, manifest=manifest)
        parts = self.parts(step)
        missing = protocol.missing_ranks(parts, self.ranks)
        if missing:
            return Outcome(missing=tuple(missing), manifest=manifest)
        # A checkpoint a restore could not put together in one folder is never committed.
        ranked = sorted(parts.items())
        protocol.merged_files([(part_prefix(step, self.epoch, r), p) for r, p in ranked])
        files = [f for p in parts.values() for f in p.files]
        entry = ManifestEntry(
            step=step,
            prefix=epoch_prefix(step, self.epoch),
            committed=now_rfc3339_micro(),
            files=len(files),
            bytes=sum(f.size for f in files),
            epoch=self.epoch,
            attempt=attempt,
            ranks=self.ranks,
            layout=protocol.merged_layout([p.layout for _, p in ranked]),
            upload_seconds=slowest([p.upload_seconds for _, p in ranked]),
        )
        key = self.run.key(RUN_MANIFEST)
        for i in range(CAS_ATTEMPTS):
            updated, dropped = protocol.commit(manifest, entry, self.keep)
            if updated is None:
                assert manifest is not None
                done = next(e for e in manifest.entries if e.step == step)
                return Outcome(already=done.epoch, manifest=manifest)
            try:
                _write_manifest(
                    self.store, key, updated.to_json(), etag, self.caps.conditional_writes
                )
                if not self.caps.conditional_writes:
                    check, _ = self.read()  # best effort without CAS: confirm it stuck
                    if check is None or entry not in check.entries:
                        raise PreconditionFailed(f"{key}: a concurrent write replaced ours")
                return Outcome(committed=True, dropped=tuple(dropped), manifest=updated)
            except PreconditionFailed:
                _backoff(i)
                manifest, etag = self.read()
                self.check_fence(manifest)
        raise StorageUnavailable(
            f"{key}: still losing the compare-and-swap after {CAS_ATTEMPTS} tries"
        )

    def sweep(
        self,
        manifest: RunManifest,
        dropped: tuple[ManifestEntry, ...] = (),
        steps: list[int] | None = None,
    ) -> int:
        """Deletes, after a commit that wrote ``manifest``, the objects of the entries
        retention dropped and those older epochs left uncommitted; returns how many. Only the
        folders of ``steps`` are listed when given (a listing of all of ``checkpoints/`` grows
        with the run on stores that keep empty folders), else all of them."""
        roots = (
            [self.run.key(checkpoint_prefix(step)) + "/" for step in sorted(set(steps))]
            if steps is not None
            else [self.run.key(CHECKPOINTS_DIR) + "/"]
        )
        keys = [self.run.relative(k) for root in roots for k, _ in self.store.list_objects(root)]
        doomed = protocol.sweepable(keys, manifest, self.epoch, list(dropped))
        if doomed:
            self.store.delete([self.run.key(k) for k in doomed])
        return len(doomed)

    def abort_stale_uploads(self) -> int:
        """Aborts the unfinished multipart uploads an older epoch, or this (epoch, rank) before
        a restart, left; another rank's or a newer epoch's in flight are left alone."""
        stale = [
            (key, upload)
            for key, upload in self.store.list_multipart(self.run.key(CHECKPOINTS_DIR) + "/")
            if protocol.abortable(self.run.relative(key), self.epoch, self.rank)
        ]
        for key, upload in stale:
            self.store.abort_multipart(key, upload)
        return len(stale)
