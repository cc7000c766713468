"""Full-object checksums (trainingrun.storage.checksum).

Covers:

- known check values: CRC32, CRC32C, CRC64NVME and SHA256 of b"123456789" (the standard
  check string), as integers and in S3's base64 encoding;
- properties (hypothesis) for every combinable algorithm: the CRCs of the parts of any split of
  a byte string (empty parts included) combine, in order, to the CRC of the whole; ``update``
  continues a CRC; ``digest`` and ``file_digest`` (with a block size that splits the file
  anywhere) agree for all four algorithms; an encoding decodes to exactly the algorithm's width
  (32 bytes for SHA256);
- ``algorithm()``: case-insensitive lookup, an unknown name is refused with the valid ones named;
  the preference order starts with the combinable CRCs and ends with SHA256.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainingrun.storage import checksum
from trainingrun.storage.checksum import CRC32, CRC32C, CRC64NVME, SHA256, Algorithm

CHECK_INPUT = b"123456789"
CRCS = [
    pytest.param(CRC64NVME, id="crc64nvme"),
    pytest.param(CRC32C, id="crc32c"),
    pytest.param(CRC32, id="crc32"),
]
ALL = [*CRCS, pytest.param(SHA256, id="sha256")]


@pytest.mark.parametrize(
    ("algo", "check"),
    [
        pytest.param(CRC32, 0xCBF43926, id="crc32"),
        pytest.param(CRC32C, 0xE3069283, id="crc32c"),
        pytest.param(CRC64NVME, 0xAE8B14860A799888, id="crc64nvme"),
    ],
)
def test_crc_check_values(algo: Algorithm, check: int) -> None:
    assert algo.of(CHECK_INPUT) == check
    assert algo.of(memoryview(CHECK_INPUT)) == check
    assert base64.b64decode(checksum.digest(algo, CHECK_INPUT)) == check.to_bytes(algo.width, "big")


def test_sha256_check_value() -> None:
    expected = bytes.fromhex("15e2b0d3c33891ebb0f1ef609ec419420c20e320ce94c65fbc8c3312448eb225")

    assert base64.b64decode(checksum.digest(SHA256, CHECK_INPUT)) == expected
    assert not SHA256.combinable


@pytest.mark.parametrize("algo", CRCS)
def test_empty_input_and_no_parts(algo: Algorithm) -> None:
    assert algo.of(b"") == 0
    assert algo.combine([]) == algo.of(b"")
    assert algo.combine([(algo.of(b"x"), 1), (algo.of(b""), 0)]) == algo.of(b"x")


@st.composite
def split(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    data = draw(st.binary(max_size=3000))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return data, [data[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("algo", CRCS)
@settings(max_examples=100)
@given(split())
def test_combined_part_crcs_equal_the_whole(
    algo: Algorithm, case: tuple[bytes, list[bytes]]
) -> None:
    data, parts = case
    assert b"".join(parts) == data

    combined = algo.combine((algo.of(p), len(p)) for p in parts)

    assert combined == algo.of(data)


@pytest.mark.parametrize("algo", CRCS)
@settings(max_examples=60)
@given(st.binary(max_size=500), st.binary(max_size=500))
def test_update_continues_a_crc(algo: Algorithm, head: bytes, tail: bytes) -> None:
    assert algo.update(tail, algo.of(head)) == algo.of(head + tail)


@pytest.mark.parametrize("algo", ALL)
@settings(max_examples=60)
@given(data=st.binary(max_size=4000), chunk=st.integers(1, 5000))
def test_digest_and_file_digest_agree(
    algo: Algorithm, data: bytes, chunk: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("digest") / "blob"
    path.write_bytes(data)

    assert checksum.file_digest(algo, str(path), chunk=chunk) == checksum.digest(algo, data)


@pytest.mark.parametrize(
    ("algo", "width"),
    [
        pytest.param(CRC64NVME, 8, id="crc64nvme-8-bytes"),
        pytest.param(CRC32C, 4, id="crc32c-4-bytes"),
        pytest.param(CRC32, 4, id="crc32-4-bytes"),
        pytest.param(SHA256, 32, id="sha256-32-bytes"),
    ],
)
@settings(max_examples=50)
@given(data=st.binary(max_size=200))
def test_encoding_has_the_algorithms_width(algo: Algorithm, width: int, data: bytes) -> None:
    encoded = checksum.digest(algo, data)

    assert len(base64.b64decode(encoded, validate=True)) == width
    if algo.combinable:
        assert algo.encode(algo.of(data)) == encoded
    else:
        assert base64.b64decode(encoded) == hashlib.sha256(data).digest()


def test_file_digest_of_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")

    for algo in (CRC64NVME, CRC32C, CRC32, SHA256):
        assert checksum.file_digest(algo, str(path)) == checksum.digest(algo, b"")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("CRC64NVME", CRC64NVME, id="exact"),
        pytest.param("crc32c", CRC32C, id="lower-case"),
        pytest.param("Sha256", SHA256, id="mixed-case"),
    ],
)
def test_algorithm_lookup(name: str, expected: Algorithm) -> None:
    assert checksum.algorithm(name) is expected
    assert expected.header == f"Checksum{expected.name}"


@pytest.mark.parametrize("name", ["MD5", "", "crc64"], ids=["md5", "empty", "crc64-no-nvme"])
def test_unknown_algorithm_refused_naming_the_valid_ones(name: str) -> None:
    with pytest.raises(ValueError, match=r"CRC64NVME, CRC32C, CRC32, SHA256"):
        checksum.algorithm(name)


def test_preference_tries_combinable_crcs_before_sha256() -> None:
    algos = [checksum.ALGORITHMS[n] for n in checksum.PREFERENCE]

    assert [a.combinable for a in algos] == [True, True, True, False]
    assert set(checksum.PREFERENCE) == set(checksum.ALGORITHMS)
