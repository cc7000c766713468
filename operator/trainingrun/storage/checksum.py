"""Full-object checksums, in the encodings S3 uses (base64 of the big-endian value).

CRC64NVME (the default), CRC32C and CRC32 can be computed per part in parallel and combined in
order, so neither the upload nor the restore reads a file twice. SHA256 is the fallback for
endpoints that know no CRC; it is computed in one sequential pass.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from awscrt import checksums


@dataclass(frozen=True)
class Algorithm:
    name: str  # as S3 spells it: ChecksumAlgorithm / Checksum<name>
    width: int  # bytes of the digest (CRC) or 0 for SHA256
    _update: Callable[[bytes | memoryview, int], int] | None
    _combine: Callable[[int, int, int], int] | None

    @property
    def combinable(self) -> bool:
        return self._combine is not None

    @property
    def header(self) -> str:
        """The boto3 parameter / response field: ChecksumCRC64NVME, ChecksumSHA256, ..."""
        return f"Checksum{self.name}"

    def of(self, data: bytes | memoryview) -> int:
        """CRC of one buffer (combinable algorithms only)."""
        assert self._update is not None
        return self._update(bytes(data) if isinstance(data, memoryview) else data, 0)

    def update(self, data: bytes | memoryview, previous: int) -> int:
        """CRC of ``data`` continuing from ``previous`` (combinable algorithms only)."""
        assert self._update is not None
        return self._update(data, previous)

    def combine(self, parts: Iterable[tuple[int, int]]) -> int:
        """CRC of the concatenation of parts given as (crc, length), in order."""
        assert self._combine is not None
        total: int | None = None
        for crc, length in parts:
            total = crc if total is None else self._combine(total, crc, length)
        return total if total is not None else 0

    def encode(self, value: int) -> str:
        return base64.b64encode(value.to_bytes(self.width, "big")).decode()


CRC64NVME = Algorithm("CRC64NVME", 8, checksums.crc64nvme, checksums.combine_crc64nvme)
CRC32C = Algorithm("CRC32C", 4, checksums.crc32c, checksums.combine_crc32c)
CRC32 = Algorithm("CRC32", 4, checksums.crc32, checksums.combine_crc32)
SHA256 = Algorithm("SHA256", 0, None, None)

ALGORITHMS = {a.name: a for a in (CRC64NVME, CRC32C, CRC32, SHA256)}
# Tried in this order when the endpoint's support is detected.
PREFERENCE = ("CRC64NVME", "CRC32C", "CRC32", "SHA256")


def algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name.upper()]
    except KeyError:
        raise ValueError(
            f"checksum algorithm {name!r} is not one of {', '.join(ALGORITHMS)}"
        ) from None


def digest(algo: Algorithm, data: bytes) -> str:
    """The encoded checksum of ``data`` in one go."""
    if algo.combinable:
        return algo.encode(algo.of(data))
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def file_digest(algo: Algorithm, path: str, chunk: int = 8 << 20) -> str:
    """The encoded checksum of a file, read sequentially."""
    with open(path, "rb") as f:
        if not algo.combinable:
            return base64.b64encode(hashlib.file_digest(f, "sha256").digest()).decode()
        crc = 0
        assert algo._update is not None
        while block := f.read(chunk):
            crc = algo._update(block, crc)
    return algo.encode(crc)
