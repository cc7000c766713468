"""A gang whose ranks wrote the same small file (``trainingrun.agent.restore`` over packs).

Covers: two ranks that both wrote ``config.json`` with the same bytes (``save_on_each_node``)
beside a small file of their own, each rank's small files packed into one object as the sidecar
packs them (``packs.plan`` and ``packs.gather``). The restore keeps one copy of the shared file
and reads past the other rank's copy inside that rank's pack: every file lands bit for bit,
wherever the shared file sits in the pack (first, between, last) and whichever rank's copy is
the one kept; a pack whose own files are corrupt is still refused; the splitter alone reads
past the bytes no target claims.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from tests.unit.fakes import DictStore
from trainingrun.agent.packs import Splitter, Target, gather, plan
from trainingrun.agent.restore import Metrics, RestoreSettings, main
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    PACKED_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    RunManifest,
    epoch_prefix,
    part_prefix,
)
from trainingrun.contract import EXIT_CHECKPOINT_BAD, EXIT_OK
from trainingrun.storage.checksum import CRC64NVME, digest
from trainingrun.storage.opener import Location, Store

RUN = Location("ckpt", "runs/ml/r1")
STEP, EPOCH = 40, 2
CONFIG = b'{"a":1}'  # the same on both ranks: 7 bytes


def _commit_gang(store: DictStore, ranks: list[dict[str, bytes]], root: Path) -> None:
    """A committed checkpoint of ``len(ranks)`` ranks, each rank's small files packed as the
    sidecar packs them, its part record and the run manifest's entry as the committer writes
    them."""
    for rank, files in enumerate(ranks):
        folder = root / f"r{rank}"
        for path, data in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(data)
        direct, packs = plan([(p, len(d)) for p, d in files.items()], workers=1)
        assert not direct and len(packs) == 1, "every file small: one pack per rank"
        prefix = part_prefix(STEP, EPOCH, rank)
        entries = []
        for pack in packs:
            data, sums = gather(folder, pack, CRC64NVME)
            store.put(RUN.key(prefix, pack.name), data)
            entries += [
                FileEntry(
                    path=m.path,
                    size=m.size,
                    checksum_algorithm=CRC64NVME.name,
                    checksum=sums[m.path],
                    pack=pack.name,
                    offset=m.offset,
                )
                for m in pack.members
            ]
        part = CheckpointManifest(
            version=PACKED_VERSION,
            step=STEP,
            files=entries,
            created="t",
            epoch=EPOCH,
            attempt=EPOCH,
            rank=rank,
            ranks=len(ranks),
        )
        store.put(RUN.key(prefix, CHECKPOINT_MANIFEST), part.model_dump_json().encode())
    entry = ManifestEntry(
        step=STEP,
        prefix=epoch_prefix(STEP, EPOCH),
        committed="t",
        files=sum(len(f) for f in ranks),
        bytes=sum(len(d) for f in ranks for d in f.values()),
        epoch=EPOCH,
        attempt=EPOCH,
        ranks=len(ranks),
    )
    manifest = RunManifest(fence=EPOCH, fence_holder="uid/2", entries=[entry])
    store.put(RUN.key(RUN_MANIFEST), manifest.to_json())


def _restore(store: DictStore, tmp_path: Path) -> tuple[int, str, Path]:
    folder = tmp_path / "checkpoints"
    log = tmp_path / "termination-log"
    settings = RestoreSettings(checkpoint_dir=folder, run=RUN, step=STEP, termination_log=log)
    code = main(cast(Store, store), settings, Metrics())
    return code, log.read_text() if log.exists() else "", folder / f"checkpoint-{STEP}"


def _shard(rank: int, size: int = 200) -> bytes:
    return bytes((rank * 7 + i) % 251 for i in range(size))


@pytest.mark.parametrize(
    "ranks",
    [
        # config.json sorts first: rank 1's shard follows the copy not downloaded (the report:
        # "shard-1.bin: got 207 of 200 bytes").
        pytest.param(
            [
                {"config.json": CONFIG, "shard-0.bin": _shard(0)},
                {"config.json": CONFIG, "shard-1.bin": _shard(1)},
            ],
            id="shared-file-first-in-the-pack",
        ),
        pytest.param(
            [
                {"a-0.bin": _shard(0, 50), "config.json": CONFIG, "z-0.bin": _shard(0)},
                {"a-1.bin": _shard(1, 50), "config.json": CONFIG, "z-1.bin": _shard(1)},
            ],
            id="shared-file-between",
        ),
        pytest.param(
            [
                {"a-0.bin": _shard(0), "config.json": CONFIG},
                {"a-1.bin": _shard(1), "config.json": CONFIG},
            ],
            id="shared-file-last",
        ),
        pytest.param(
            [
                {"config.json": CONFIG, "shard-0.bin": _shard(0), "tokenizer.json": b"t" * 30},
                {"config.json": CONFIG, "shard-1.bin": _shard(1), "tokenizer.json": b"t" * 30},
                {"config.json": CONFIG, "shard-2.bin": _shard(2), "tokenizer.json": b"t" * 30},
            ],
            id="three-ranks-two-shared-files",
        ),
    ],
)
def test_a_gang_whose_ranks_wrote_the_same_small_file_restores_bit_for_bit(
    tmp_path: Path, ranks: list[dict[str, bytes]]
) -> None:
    store = DictStore()
    _commit_gang(store, ranks, tmp_path / "saved")

    code, message, folder = _restore(store, tmp_path)

    assert (code, message) == (EXIT_OK, "")
    expected = {path: data for files in ranks for path, data in files.items()}
    restored = {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".trainingrun")
    }
    assert restored == expected


def test_a_corrupt_file_of_a_pack_is_still_refused(tmp_path: Path) -> None:
    """Reading past the shared copy does not read past a wrong byte of a file that lands."""
    store = DictStore()
    ranks = [
        {"config.json": CONFIG, "shard-0.bin": _shard(0)},
        {"config.json": CONFIG, "shard-1.bin": _shard(1)},
    ]
    _commit_gang(store, ranks, tmp_path / "saved")
    key = RUN.key(part_prefix(STEP, EPOCH, 1), ".trainingrun-packs/0")
    data = bytearray(store.objects[key])
    data[-1] ^= 0xFF  # in shard-1.bin, after the shared copy
    store.objects[key] = bytes(data)

    code, message, _ = _restore(store, tmp_path)

    assert code == EXIT_CHECKPOINT_BAD
    assert "shard-1.bin" in message and "checksum" in message


def test_the_splitter_reads_past_bytes_no_target_claims(tmp_path: Path) -> None:
    pack = b"SKIP" + b"keep-me" + b"GAP" + b"and-me"
    targets = [
        Target("one", str(tmp_path / "one"), 4, 7, digest(CRC64NVME, b"keep-me")),
        Target("two", str(tmp_path / "two"), 14, 6, digest(CRC64NVME, b"and-me")),
    ]
    split = Splitter(targets, CRC64NVME)

    for i in range(0, split.span, 3):  # blocks that straddle every boundary
        split(pack[i : i + 3])

    assert split.finish() == []
    assert (tmp_path / "one").read_bytes() == b"keep-me"
    assert (tmp_path / "two").read_bytes() == b"and-me"
