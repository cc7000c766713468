"""How much of a part's folder listing the operator reads, and how long a start may read.

Covers:

- the listing of a committed part's folder stops once every object the part names is found
  (objects listed after them are not read);
- a listing that goes on without the named objects (an endpoint that lists forever) is given
  up after the objects the part names plus ``LISTING_MARGIN``, and the checkpoint is passed
  over with a reason that says so;
- a choice of checkpoint whose calls go on past ``CHOOSE_SECONDS`` stops before its next call
  with ``ReadsTooSlow`` (a StorageUnavailable: the start waits and tries again), however many
  parts the checkpoint names.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import cast

import pytest

from tests.unit.fakes import FakeBucket
from trainingrun.checkpoint.lookup import (
    CHOOSE_SECONDS,
    LISTING_MARGIN,
    ReadsTooSlow,
    check_committed,
    choose_checkpoint,
    read_run_manifest,
)
from trainingrun.checkpoint.manifest import checkpoint_prefix
from trainingrun.storage.opener import Location, StorageUnavailable, Store

RUN = Location("bkt", "runs/ml/r1")
GUARD = 100_000
FILES = {"model.safetensors": b"m" * 7, "optimizer.pt": b"o" * 3}


class EndlessListing(FakeBucket):
    """A bucket whose listings go on without end after the real objects (``junk_first``:
    before them); ``listed`` counts the keys handed out."""

    def __init__(self, junk_first: bool) -> None:
        super().__init__()
        self.junk_first = junk_first
        self.listed = 0

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        junk = ((f"{prefix}aaa-junk-{i:09d}", 1) for i in itertools.count())
        real = super().list_objects(prefix)
        keys = itertools.chain(junk) if self.junk_first else itertools.chain(real, junk)
        for key in keys:
            self.listed += 1
            # A reader without a bound would read on until memory runs out: fail instead.
            assert self.listed <= GUARD, f"{GUARD} keys read and still listing"
            yield key


def test_the_listing_stops_once_the_named_objects_are_found() -> None:
    bucket = EndlessListing(junk_first=False)
    bucket.commit(RUN, 5, files=FILES)
    manifest = read_run_manifest(cast(Store, bucket), RUN)
    assert manifest is not None

    ckpt, why = check_committed(cast(Store, bucket), RUN, manifest.entries[0])

    assert why is None
    assert ckpt is not None
    # MANIFEST.json, model.safetensors, optimizer.pt: the last named one ends the listing.
    assert bucket.listed == 3


def test_an_endless_listing_is_given_up_after_its_bound() -> None:
    bucket = EndlessListing(junk_first=True)
    bucket.commit(RUN, 5, files=FILES)
    manifest = read_run_manifest(cast(Store, bucket), RUN)
    assert manifest is not None

    ckpt, why = check_committed(cast(Store, bucket), RUN, manifest.entries[0])

    assert ckpt is None
    bound = len(FILES) + LISTING_MARGIN
    assert bucket.listed == bound + 1  # the one past the bound tells it
    assert why == (
        f"{checkpoint_prefix(5)} lists more than {bound} objects without the {len(FILES)} its "
        "MANIFEST.json names: remove what is not the checkpoint's from its folder"
    )


def test_an_endless_listing_passes_the_checkpoint_over() -> None:
    bucket = EndlessListing(junk_first=True)
    bucket.commit(RUN, 5, files=FILES)

    choice = choose_checkpoint(cast(Store, bucket), RUN, set())

    assert choice.entry is None
    [(step, why)] = choice.rejected
    assert step == 5
    assert "lists more than" in why


class Slow(FakeBucket):
    """A bucket whose every call takes ``seconds`` of a fake clock."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.now, self.calls = seconds, 0.0, 0

    def clock(self) -> float:
        return self.now

    def get(self, key: str) -> bytes | None:
        self.calls += 1
        self.now += self.seconds
        return super().get(key)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        self.calls += 1
        self.now += self.seconds
        yield from super().list_objects(prefix)


@pytest.mark.parametrize("seconds", [5.0, 29.0])
def test_a_choice_stops_reading_after_its_time(seconds: float) -> None:
    bucket = Slow(seconds)
    bucket.commit(RUN, *range(1, 40), files=FILES)
    for step in range(1, 40):  # every one broken: each costs a read and a listing
        del bucket.objects[RUN.key(checkpoint_prefix(step), "optimizer.pt")]

    with pytest.raises(ReadsTooSlow, match=f"took over {CHOOSE_SECONDS:g} s") as e:
        choose_checkpoint(cast(Store, bucket), RUN, {39}, tries=None, monotonic=bucket.clock)

    assert isinstance(e.value, StorageUnavailable)
    assert bucket.calls == math.ceil(CHOOSE_SECONDS / seconds)
