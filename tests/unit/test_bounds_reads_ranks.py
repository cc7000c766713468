"""The rank count and the parts a committed entry names are bounded before anything is built
from them: a manifest of a few hundred bytes cannot make the operator hold gigabytes.

Covers:

- a run manifest entry (and a part record) naming more ranks than the API lets ``replicas``
  have is refused at parse time with a ManifestError naming the field and the limit, and the
  limit is the API's own ``replicas`` maximum;
- reading such a manifest and choosing a checkpoint from it (the operator's start) grows the
  process's resident memory by less than 10 MB (it built one key per rank before: ~190 MB for
  two million ranks);
- a checkpoint whose parts together list more than ``MAX_CHECKPOINT_FILES`` files, or hold
  more than ``MAX_CHECKPOINT_RECORD_BYTES`` of part records, is passed over with the reason,
  without reading the parts past the bound.
"""

from __future__ import annotations

import json
import os
from typing import cast

import pytest
from annotated_types import Le

from tests.unit.fakes import DictStore
from trainingrun.api import TrainingRunSpec
from trainingrun.checkpoint.lookup import choose_checkpoint
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    MAX_CHECKPOINT_FILES,
    MAX_CHECKPOINT_RECORD_BYTES,
    MAX_RANKS,
    RUN_MANIFEST,
    ManifestError,
    epoch_prefix,
    parse_checkpoint_manifest,
    parse_run_manifest,
    part_prefix,
)
from trainingrun.storage.opener import Location, Store

RUN = Location("bkt", "runs/ml/r1")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _run_manifest(ranks: int, step: int = 7, epoch: int = 1) -> bytes:
    entry = {
        "step": step,
        "prefix": epoch_prefix(step, epoch),
        "committed": "t",
        "files": 1,
        "bytes": 1,
        "epoch": epoch,
        "ranks": ranks,
    }
    body = {"version": 2, "fence": epoch, "entries": [entry]}
    return json.dumps(body, separators=(",", ":")).encode()


class Sampling(DictStore):
    """A store that samples the process's resident memory at every call: the peak of a read
    while it runs, which freed memory afterwards would hide."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = _rss()

    def get(self, key: str) -> bytes | None:
        self.peak = max(self.peak, _rss())
        return super().get(key)


def test_the_rank_limit_is_the_apis_replicas_maximum() -> None:
    [limit] = [m.le for m in TrainingRunSpec.model_fields["replicas"].metadata if isinstance(m, Le)]

    assert limit == MAX_RANKS


@pytest.mark.parametrize("ranks", [MAX_RANKS + 1, 100_000_000])
def test_a_huge_rank_count_is_refused_naming_the_field_and_the_limit(ranks: int) -> None:
    data = _run_manifest(ranks)
    assert len(data) < 200  # the size of the finding's manifest

    with pytest.raises(ManifestError) as e:
        parse_run_manifest(data)

    assert "ranks" in str(e.value)
    assert f"at most {MAX_RANKS}" in str(e.value)


def test_the_most_ranks_the_api_allows_are_read() -> None:
    manifest = parse_run_manifest(_run_manifest(MAX_RANKS))

    assert manifest.entries[0].ranks == MAX_RANKS


def test_a_part_record_of_too_many_ranks_is_refused() -> None:
    body = {
        "version": 2,
        "step": 7,
        "files": [],
        "created": "t",
        "epoch": 1,
        "ranks": MAX_RANKS + 1,
    }

    with pytest.raises(ManifestError, match=f"ranks.*at most {MAX_RANKS}"):
        parse_checkpoint_manifest(json.dumps(body).encode(), 7, 1, 0)


def test_reading_a_huge_rank_count_costs_no_memory() -> None:
    """2,000,000 ranks: the old code built ~190 MB of part keys here (100,000,000: ~9 GiB)."""
    store = Sampling()
    store.objects[RUN.key(RUN_MANIFEST)] = _run_manifest(2_000_000)
    before = _rss()

    try:
        manifest = parse_run_manifest(store.objects[RUN.key(RUN_MANIFEST)])
        choice = choose_checkpoint(cast(Store, store), RUN, set(), manifest)
    except ManifestError as e:
        refused: str | None = str(e)
    else:
        refused = None
        assert choice.entry is None
    grew = max(store.peak, _rss()) - before

    assert grew < 10 << 20, f"resident memory grew by {grew >> 20} MiB"
    assert refused is not None and "ranks" in refused


def _parts(store: DictStore, ranks: int, files: int, pad: int = 0) -> None:
    """A committed step 7 of epoch 1 with ``ranks`` parts of ``files`` files each (absent
    objects: the bound must refuse the entry before any listing)."""
    store.objects[RUN.key(RUN_MANIFEST)] = _run_manifest(ranks)
    for rank in range(ranks):
        listed = [
            {"path": f"r{rank}-{i}", "size": 0, "checksum_algorithm": "CRC32C", "checksum": "x"}
            for i in range(files)
        ]
        body = {"version": 2, "step": 7, "files": listed, "created": "t" + " " * pad}
        body.update(epoch=1, rank=rank, ranks=ranks)
        store.objects[RUN.key(part_prefix(7, 1, rank), CHECKPOINT_MANIFEST)] = json.dumps(
            body
        ).encode()


def test_a_checkpoint_of_too_many_files_in_all_is_passed_over_unread() -> None:
    store = DictStore()
    per_part = 5_000
    ranks = MAX_CHECKPOINT_FILES // per_part + 3
    _parts(store, ranks, per_part)

    choice = choose_checkpoint(cast(Store, store), RUN, set())

    [(step, why)] = choice.rejected
    assert step == 7
    assert f"over the cap of {MAX_CHECKPOINT_FILES}" in why
    parts_read = [k for k in store.gets if k.endswith(CHECKPOINT_MANIFEST)]
    assert len(parts_read) == MAX_CHECKPOINT_FILES // per_part + 1


def test_a_checkpoint_of_too_many_record_bytes_is_passed_over_unread() -> None:
    store = DictStore()
    pad = 1 << 20  # part records of 1 MiB of blanks, no files: few values, many bytes
    ranks = MAX_CHECKPOINT_RECORD_BYTES // pad + 3
    _parts(store, ranks, 0, pad)

    choice = choose_checkpoint(cast(Store, store), RUN, set())

    [(step, why)] = choice.rejected
    assert step == 7
    assert f"over the cap of {MAX_CHECKPOINT_RECORD_BYTES} bytes" in why
    parts_read = [k for k in store.gets if k.endswith(CHECKPOINT_MANIFEST)]
    assert len(parts_read) <= MAX_CHECKPOINT_RECORD_BYTES // pad + 1
