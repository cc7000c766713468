"""Small files travel packed: many of them back to back in one object.

Each object costs requests (a PUT and a HEAD on upload, a GET on restore), and each request costs
the client about 2.8 ms of CPU in botocore whatever its size: a PEFT adapter checkpoint of 1,000
files of 10-200 KiB went up at 32 MiB/s and came back at 47 MiB/s (docs/benchmarks.md), where one
large file moves at hundreds of MiB/s. So a part's files of at most ``FILE_MAX`` bytes go into
packs under ``PACK_DIR/`` beside the large files; each file keeps its own checksum in
``MANIFEST.json`` (with the pack and its offset), and the restore splits each pack back into its
files as it streams in, verifying each.

Packs are spread over the transfer's workers: as many packs as workers (each at least
``PACK_MIN``, at most ``PACK_MAX``, one checked PUT), so small files keep every connection busy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainingrun.checkpoint.local import WRITE_BLOCK, create_for_writing
from trainingrun.checkpoint.manifest import PACK_DIR, is_pack_name
from trainingrun.storage.checksum import Algorithm, digest, file_digest

MiB = 1 << 20
FILE_MAX = 1 * MiB  # files up to this size are packed
PACK_MIN = 1 * MiB
PACK_MAX = 16 * MiB  # the transfer's multipart threshold: a pack is one PUT


class Overrun(Exception):
    """A pack sent more bytes than its files take."""


class PackChanged(Exception):
    """A packed file changed while it was read (size or modification time): not complete yet."""


@dataclass(frozen=True)
class Member:
    path: str  # relative to the checkpoint folder
    offset: int
    size: int


@dataclass(frozen=True)
class Pack:
    name: str  # relative to the part's folder: PACK_DIR/<n>
    members: tuple[Member, ...]

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)


def plan(files: list[tuple[str, int]], workers: int) -> tuple[list[tuple[str, int]], list[Pack]]:
    """(files sent as their own objects, packs) for a part's (path, size) files. Nothing is
    packed when fewer than two files are small enough, or a file is already under PACK_DIR."""
    small = sorted((f for f in files if f[1] <= FILE_MAX), key=lambda f: f[0])
    if len(small) < 2 or any(is_pack_name(path) for path, _ in files):
        return list(files), []
    total = sum(size for _, size in small)
    target = min(max(-(-total // max(workers, 1)), PACK_MIN), PACK_MAX)
    packs: list[Pack] = []
    members: list[Member] = []
    at = 0
    for path, size in small:
        if members and at + size > target:
            packs.append(Pack(f"{PACK_DIR}/{len(packs)}", tuple(members)))
            members, at = [], 0
        members.append(Member(path, at, size))
        at += size
    packs.append(Pack(f"{PACK_DIR}/{len(packs)}", tuple(members)))
    packed = {m.path for p in packs for m in p.members}
    return [f for f in files if f[0] not in packed], packs


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def gather(root: Path, pack: Pack, algo: Algorithm) -> tuple[bytes, dict[str, str]]:
    """The pack's bytes, read from the files under ``root``, and each file's checksum; raises
    PackChanged when a file is not the size planned or changes while it is read."""
    out = bytearray()
    sums: dict[str, str] = {}
    for m in pack.members:
        with open(root / m.path, "rb") as f:
            before = _stamp(os.fstat(f.fileno()))
            data = f.read(m.size + 1)
            if len(data) != m.size or before[0] != m.size:
                raise PackChanged(f"{root / m.path} is no longer {m.size} bytes")
            if _stamp(os.fstat(f.fileno())) != before:
                raise PackChanged(f"{root / m.path} changed while being read")
        sums[m.path] = digest(algo, data)
        out += data
    return bytes(out), sums


def _write_all(fd: int, data: memoryview) -> None:
    while data.nbytes:
        data = data[os.write(fd, data[:WRITE_BLOCK]) :]


@dataclass(frozen=True)
class Target:
    """Where one packed file goes on restore: its name in the checkpoint, its local path, its
    place in the pack and its checksum."""

    name: str
    dest: str
    offset: int
    size: int
    expected: str


class Splitter:
    """A sink for a pack's bytes from offset 0 on, in order: writes each file's bytes to its
    destination and checksums them as they land. ``finish`` closes the files and names every
    one whose size or checksum is wrong.

    Bytes no target claims are read past, unchecked: a member the restore does not download
    from this pack because another rank wrote the same file (same size and checksum) and that
    copy is the one kept (``protocol.merged_files``). They land nowhere, so nothing the trainer
    reads depends on them, and refusing the checkpoint over them would fall back from one whose
    every restored file verifies."""

    def __init__(self, targets: list[Target], algo: Algorithm) -> None:
        self.targets = sorted(targets, key=lambda t: t.offset)
        self.algo = algo
        self.crcs = [0] * len(self.targets)
        self.written = [0] * len(self.targets)
        self.fds: list[int | None] = [None] * len(self.targets)
        self.at = 0  # bytes of the pack seen
        self.index = 0  # the target the next byte belongs to

    @property
    def span(self) -> int:
        """The bytes of the pack its targets take, from its start."""
        return max((t.offset + t.size for t in self.targets), default=0)

    def __call__(self, block: bytes | memoryview) -> None:
        view = memoryview(block)
        while view.nbytes:
            if self.index >= len(self.targets):
                raise Overrun(f"{view.nbytes} bytes past the end of its last file")
            t = self.targets[self.index]
            if self.at < t.offset:  # a member no target claims: read past it
                skip = min(t.offset - self.at, view.nbytes)
                self.at += skip
                view = view[skip:]
                continue
            take = view[: t.offset + t.size - self.at]
            _write_all(self._fd(self.index), take)
            if self.algo.combinable:
                self.crcs[self.index] = self.algo.update(take, self.crcs[self.index])
            self.written[self.index] += take.nbytes
            self.at += take.nbytes
            view = view[take.nbytes :]
            if self.at == t.offset + t.size:
                self._close(self.index)
                self.index += 1

    def _fd(self, i: int) -> int:
        fd = self.fds[i]
        if fd is None:
            fd = create_for_writing(self.targets[i].dest)
            self.fds[i] = fd
        return fd

    def _close(self, i: int) -> None:
        os.close(self._fd(i))  # an empty file is created too
        self.fds[i] = -1

    def finish(self) -> list[str]:
        """Closes every file; the problems, one per file that is short or does not match."""
        for i, fd in enumerate(self.fds):
            if fd is None or fd >= 0:
                self._close(i)
        problems = []
        for i, t in enumerate(self.targets):
            if self.written[i] != t.size:
                problems.append(f"{t.name}: got {self.written[i]} of {t.size} bytes")
                continue
            if self.algo.combinable:
                actual = self.algo.encode(self.crcs[i])
            else:
                actual = file_digest(self.algo, t.dest)
            if actual != t.expected:
                problems.append(
                    f"{t.name}: {self.algo.name} checksum {actual} does not match the recorded "
                    f"{t.expected}"
                )
        return problems
