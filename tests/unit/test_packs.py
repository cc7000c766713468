"""Small files packed (trainingrun.agent.packs) and what the manifest accepts of packs.

Covers: which files are packed and how packs are sized (fewer than two small files, a file
already under the pack folder, the spread over workers, the bounds); a pack read from its files
and a file that changed; the splitter for any block boundaries, empty files, a short or
overlong pack and a wrong byte, with CRC and SHA256; the manifest's checks of packs (name,
back to back, version, a file under the pack folder) and the operator's listing check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainingrun.agent.packs import (
    FILE_MAX,
    PACK_MAX,
    PACK_MIN,
    Overrun,
    PackChanged,
    Splitter,
    Target,
    gather,
    plan,
)
from trainingrun.checkpoint.manifest import (
    PACK_DIR,
    PACKED_VERSION,
    ManifestError,
    listing_problems,
    parse_checkpoint_manifest,
)
from trainingrun.storage.checksum import CRC32C, CRC64NVME, SHA256, Algorithm, digest

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    ("files", "workers", "direct", "packs"),
    [
        pytest.param([("a", 10), ("w", 5 * MiB)], 4, ["a", "w"], [], id="one-small-file"),
        pytest.param([("w", 5 * MiB), ("x", 2 * MiB)], 4, ["w", "x"], [], id="no-small-files"),
        pytest.param(
            [("b", 10), ("a", 20), ("w", 5 * MiB)], 4, ["w"], [["a", "b"]], id="sorted-by-name"
        ),
        pytest.param(
            [("a", 10), (f"{PACK_DIR}/0", 20)], 4, [f"{PACK_DIR}/0", "a"], [], id="name-taken"
        ),
        pytest.param(
            [("a", FILE_MAX), ("b", FILE_MAX + 1), ("c", 1)], 1, ["b"], [["a", "c"]], id="limit"
        ),
        # 8 files of 512 KiB over 4 workers: 1 MiB packs of two files.
        pytest.param(
            [(f"f{i}", 512 * KiB) for i in range(8)],
            4,
            [],
            [["f0", "f1"], ["f2", "f3"], ["f4", "f5"], ["f6", "f7"]],
            id="spread-over-workers",
        ),
        # Tiny files are never split below PACK_MIN: one pack however many workers.
        pytest.param(
            [(f"f{i}", 100) for i in range(5)], 16, [], [[f"f{i}" for i in range(5)]], id="min"
        ),
    ],
)
def test_plan(
    files: list[tuple[str, int]], workers: int, direct: list[str], packs: list[list[str]]
) -> None:
    got_direct, got_packs = plan(files, workers)

    assert sorted(p for p, _ in got_direct) == direct
    assert [[m.path for m in p.members] for p in got_packs] == packs
    assert [p.name for p in got_packs] == [f"{PACK_DIR}/{i}" for i in range(len(packs))]


@given(
    st.lists(st.integers(min_value=0, max_value=FILE_MAX), min_size=2, max_size=300),
    st.integers(min_value=1, max_value=32),
)
def test_packs_hold_each_small_file_once_back_to_back_within_bounds(
    sizes: list[int], workers: int
) -> None:
    files = [(f"f{i:03d}", size) for i, size in enumerate(sizes)]

    direct, packs = plan(files, workers)

    assert direct == []
    assert sorted(m.path for p in packs for m in p.members) == sorted(p for p, _ in files)
    for p in packs:
        assert [m.offset for m in p.members] == [
            sum(m.size for m in p.members[:i]) for i in range(len(p.members))
        ]
    # Every pack but the last reached the target; none passed PACK_MAX unless one file did.
    assert all(p.size <= max(PACK_MAX, FILE_MAX) for p in packs)
    target = min(max(-(-sum(sizes) // workers), PACK_MIN), PACK_MAX)
    assert all(p.size + FILE_MAX > target for p in packs[:-1])


def _files(root: Path, sizes: dict[str, int]) -> None:
    for name, size in sizes.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(os.urandom(size))


def test_gather_reads_the_files_back_to_back_with_their_checksums(tmp_path: Path) -> None:
    _files(tmp_path, {"a.json": 300, "sub/b.bin": 0, "c.txt": 4000})
    _, (pack,) = plan([("a.json", 300), ("sub/b.bin", 0), ("c.txt", 4000)], 4)

    data, sums = gather(tmp_path, pack, CRC64NVME)

    names = ["a.json", "c.txt", "sub/b.bin"]
    assert data == b"".join((tmp_path / n).read_bytes() for n in names)
    assert sums == {n: digest(CRC64NVME, (tmp_path / n).read_bytes()) for n in names}


def test_gather_refuses_a_file_whose_size_changed_since_the_scan(tmp_path: Path) -> None:
    _files(tmp_path, {"a": 300, "b": 400})
    _, (pack,) = plan([("a", 300), ("b", 400)], 4)
    (tmp_path / "b").write_bytes(b"x" * 401)

    with pytest.raises(PackChanged, match="no longer 400 bytes"):
        gather(tmp_path, pack, CRC32C)


def _targets(root: Path, blobs: dict[str, bytes], algo: Algorithm) -> tuple[bytes, list[Target]]:
    targets, at = [], 0
    for name, blob in blobs.items():
        targets.append(Target(name, str(root / name), at, len(blob), digest(algo, blob)))
        at += len(blob)
    return b"".join(blobs.values()), targets


@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=8))
@pytest.mark.parametrize("algo", [CRC64NVME, SHA256], ids=lambda a: a.name)
def test_splitter_puts_each_file_back_whatever_the_block_boundaries(
    tmp_path_factory: pytest.TempPathFactory, algo: Algorithm, cuts: list[int]
) -> None:
    root = tmp_path_factory.mktemp("split")
    blobs = {"a": os.urandom(1000), "empty": b"", "b": os.urandom(2500), "c": os.urandom(7)}
    data, targets = _targets(root, blobs, algo)
    split = Splitter(targets, algo)

    at, i = 0, 0
    while at < len(data):
        n = cuts[i % len(cuts)]
        split(memoryview(data)[at : at + n])
        at, i = at + n, i + 1

    assert split.finish() == []
    assert {n: (root / n).read_bytes() for n in blobs} == blobs


@pytest.mark.parametrize(
    ("sent", "problem"),
    [
        pytest.param(lambda d: d[:-3], "c: got 4 of 7 bytes", id="short"),
        pytest.param(lambda d: d[:500] + b"!" + d[501:], "a: CRC32C checksum", id="flipped"),
    ],
)
def test_splitter_names_each_file_that_is_short_or_wrong(
    tmp_path: Path, sent: Any, problem: str
) -> None:
    blobs = {"a": os.urandom(1000), "b": os.urandom(20), "c": os.urandom(7)}
    data, targets = _targets(tmp_path, blobs, CRC32C)
    split = Splitter(targets, CRC32C)

    split(sent(data))
    problems = split.finish()

    assert len(problems) == 1 and problems[0].startswith(problem)


def test_splitter_refuses_bytes_past_its_last_file(tmp_path: Path) -> None:
    data, targets = _targets(tmp_path, {"a": b"12345"}, CRC32C)
    split = Splitter(targets, CRC32C)

    with pytest.raises(Overrun, match="2 bytes past"):
        split(data + b"xy")
    split.finish()


def _part(files: list[dict[str, Any]], version: int = PACKED_VERSION) -> bytes:
    return json.dumps({"version": version, "step": 7, "files": files, "created": "t"}).encode()


def _file(path: str, size: int, pack: str | None = None, offset: int = 0) -> dict[str, Any]:
    checksum = digest(CRC32C, b"")
    entry = {"path": path, "size": size, "checksum_algorithm": "CRC32C", "checksum": checksum}
    return entry | ({"pack": pack, "offset": offset} if pack else {})


PACK = f"{PACK_DIR}/0"


def test_a_packed_part_parses() -> None:
    part = parse_checkpoint_manifest(
        _part([_file("b", 5, PACK, 3), _file("a", 3, PACK, 0), _file("w", 9)]), 7
    )

    assert [(f.path, f.source, f.offset) for f in part.files] == [
        ("b", PACK, 3),
        ("a", PACK, 0),
        ("w", "w", 0),
    ]


@pytest.mark.parametrize(
    ("files", "version", "message"),
    [
        pytest.param([_file("a", 3, "elsewhere/0")], 3, "is not a name under", id="pack-name"),
        pytest.param([_file("a", 3, "../x")], 3, "'..' part", id="pack-escapes"),
        pytest.param([_file("a", 3, PACK, 0), _file("b", 5, PACK, 4)], 3, "back to back", id="gap"),
        pytest.param(
            [_file("a", 3, PACK, 0), _file("b", 5, PACK, 2)], 3, "back to back", id="overlap"
        ),
        pytest.param([_file("a", 3, PACK, 1)], 3, "back to back", id="not-from-the-start"),
        pytest.param([_file("a", 3, PACK, 0)], 2, "packed files but version 2", id="version"),
        pytest.param([_file(f"{PACK_DIR}/1", 3)], 3, "where packs go", id="file-in-pack-dir"),
    ],
)
def test_packs_a_restore_could_not_split_are_refused(
    files: list[dict[str, Any]], version: int, message: str
) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_checkpoint_manifest(_part(files, version), 7)


@pytest.mark.parametrize(
    ("listing", "problems"),
    [
        pytest.param({PACK: 8, "w": 9}, [], id="intact"),
        pytest.param({PACK: 12, "w": 9}, [], id="pack-larger"),
        pytest.param({"w": 9}, ["a (in .trainingrun-packs/0) is missing"], id="pack-gone"),
        pytest.param(
            {PACK: 7, "w": 9}, [".trainingrun-packs/0 has 7 bytes, too few to hold b"], id="short"
        ),
    ],
)
def test_listing_problems_of_packed_files(listing: dict[str, int], problems: list[str]) -> None:
    part = parse_checkpoint_manifest(
        _part([_file("a", 3, PACK, 0), _file("b", 5, PACK, 3), _file("w", 9)]), 7
    )

    assert listing_problems(part, listing)[: len(problems) or None] == problems
    assert bool(listing_problems(part, listing)) == bool(problems)
