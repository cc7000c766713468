"""The bucket manifests: parsing, validation, the key layout, the choice of candidates and
listing checks.

Covers:

- caps (ManifestTooLarge, a ManifestError, naming the manifest, the cap and the fix): a
  manifest.json over 4 MiB or listing more than 1000 checkpoints, a MANIFEST.json over 8 MiB or
  listing more than 10000 files, and either holding more JSON values (a list of {} decodes to
  25 times its bytes) than its items can have, refused before decoding; manifests just within
  the caps parse; file names over 255 bytes or with a character that is not printable (control,
  escape, zero-width, line separator) are refused, by safe_relative_path and by the parser;
- parse_run_manifest / parse_checkpoint_manifest refuse with ManifestError: malformed JSON,
  bytes that are not UTF-8, a non-object, a missing or non-integer version, a future version
  (the message says to upgrade), duplicate steps, a prefix other than epoch_prefix(step,
  epoch), an entry of an epoch past the fence, a version-1 entry of several ranks, a negative
  step, a part of another step, epoch or rank (named by its key), a file listed twice, the
  manifest listing itself, and unsafe file names ("../../x", "/etc/passwd", "a/../b", "" ...);
- well-formed manifests parse: version 2 with fence, holder, epochs, attempts and ranks; a
  version-1 manifest.json and MANIFEST.json as epoch 0, one rank, the legacy layout; extra keys
  are ignored; ``latest`` is the newest step whatever the order; totals add up;
- epoch_prefix / part_prefix / ManifestEntry.part_prefixes, version 1 and 2;
- candidates(): newest first, skipping bad steps; listing_problems(): missing files and wrong
  sizes are named, extra objects are not problems;
- properties (hypothesis): RunManifest.to_json -> parse_run_manifest round-trips; candidates()
  is sorted descending without bad steps; safe_relative_path() never accepts a path that leaves
  its base, and accepts every path of ordinary segments;
- with_committed() (hypothesis): keeps exactly the newest min(keep, n) distinct steps, kept and
  dropped partition every step, the new entry survives unless ``keep`` newer steps exist, a step
  already committed is never replaced (nothing changes), the result round-trips; keep < 1 is
  refused; worth_uploading() agrees with it;
- same_files(): creation time aside, any difference in path, size, algorithm, checksum, step,
  epoch, rank or ranks counts;
- the parsers raise only ManifestError for arbitrary bytes, JSON, JSON objects with a valid
  version, and crafted inputs (deep nesting, huge integers, a UTF-8 BOM, UTF-16).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_MANIFEST_MAX_BYTES,
    MANIFEST_VERSION,
    MAX_ENTRIES,
    MAX_FILES,
    MAX_NAME_BYTES,
    PACKED_VERSION,
    RUN_MANIFEST_MAX_BYTES,
    CheckpointManifest,
    ManifestEntry,
    ManifestError,
    ManifestTooLarge,
    RunManifest,
    checkpoint_prefix,
    epoch_prefix,
    listing_problems,
    parse_checkpoint_manifest,
    parse_run_manifest,
    part_prefix,
    safe_relative_path,
)
from trainingrun.checkpoint.protocol import candidates, same_files, with_committed, worth_uploading

BASE = "/checkpoints/checkpoint-7"


def _entry(step: int, epoch: int = 0, **overrides: Any) -> dict[str, Any]:
    return {
        "step": step,
        "prefix": epoch_prefix(step, epoch),
        "epoch": epoch,
        "committed": "2025-01-01T12:00:00Z",
        "files": 2,
        "bytes": 1024,
        **overrides,
    }


def _run_manifest(*entries: dict[str, Any], **top: Any) -> bytes:
    return json.dumps({"version": MANIFEST_VERSION, "entries": list(entries), **top}).encode()


def _file(path: str, size: int = 10) -> dict[str, Any]:
    return {"path": path, "size": size, "checksum_algorithm": "CRC32C", "checksum": "AAAAAA=="}


def _checkpoint_manifest(step: int, *files: dict[str, Any], **top: Any) -> bytes:
    body = {
        "version": MANIFEST_VERSION,
        "step": step,
        "files": list(files),
        "created": "2025-01-01T12:00:00Z",
        **top,
    }
    return json.dumps(body).encode()


def _entries(*steps: int) -> RunManifest:
    return RunManifest(entries=[ManifestEntry.model_validate(_entry(s)) for s in steps])


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"{not json", "not valid JSON", id="malformed-json"),
        pytest.param(b"", "not valid JSON", id="empty-file"),
        pytest.param(b'{"version": 1, "entries": [', "not valid JSON", id="truncated-write"),
        pytest.param(b"\xff\xfe\xfa\x00garbage", "not valid JSON", id="not-utf8"),
        pytest.param(b"[1, 2]", "JSON object, got list", id="array-not-object"),
        pytest.param(b'"manifest"', "JSON object, got str", id="string-not-object"),
        pytest.param(b"null", "JSON object, got NoneType", id="null-not-object"),
        pytest.param(b'{"entries": []}', "no positive integer 'version'", id="missing-version"),
        pytest.param(
            b'{"version": "1", "entries": []}', "no positive integer 'version'", id="str-version"
        ),
        pytest.param(
            b'{"version": 1.5, "entries": []}', "no positive integer 'version'", id="float-version"
        ),
        pytest.param(
            b'{"version": true, "entries": []}', "no positive integer 'version'", id="bool-version"
        ),
        pytest.param(
            b'{"version": 0, "entries": []}', "no positive integer 'version'", id="zero-version"
        ),
        pytest.param(
            _run_manifest(_entry(100), _entry(100)), "names a step twice", id="duplicate-steps"
        ),
        pytest.param(
            _run_manifest(_entry(100, prefix="checkpoints/checkpoint-99/")),
            "expected 'checkpoints/checkpoint-100/'",
            id="prefix-of-another-step",
        ),
        pytest.param(
            _run_manifest(_entry(100, prefix="../other-run/checkpoints/checkpoint-100/")),
            "has prefix",
            id="prefix-outside-the-run",
        ),
        pytest.param(
            _run_manifest(_entry(100, 3, prefix="checkpoints/checkpoint-100/"), fence=3),
            "expected 'checkpoints/checkpoint-100/e3/'",
            id="v2-entry-with-v1-prefix",
        ),
        pytest.param(
            _run_manifest(_entry(100, prefix="checkpoints/checkpoint-100/e3/"), fence=3),
            "expected 'checkpoints/checkpoint-100/'",
            id="v1-entry-with-v2-prefix",
        ),
        pytest.param(
            _run_manifest(_entry(100, 4), fence=3),
            "epoch 4 and 1 ranks, which its fence 3 cannot have let in",
            id="entry-past-the-fence",
        ),
        pytest.param(
            _run_manifest(_entry(100, ranks=2)), "epoch 0 and 2 ranks", id="v1-entry-of-2-ranks"
        ),
        pytest.param(_run_manifest(fence=-1), "malformed", id="negative-fence"),
        pytest.param(_run_manifest(_entry(1, 1, ranks=0), fence=1), "malformed", id="no-ranks"),
        pytest.param(_run_manifest(_entry(-1)), "malformed", id="negative-step"),
        pytest.param(_run_manifest(_entry(1, bytes=-5)), "malformed", id="negative-bytes"),
        pytest.param(
            json.dumps({"version": 1, "entries": "all"}).encode(), "malformed", id="entries-str"
        ),
    ],
)
def test_run_manifest_refused(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_run_manifest(data)


@pytest.mark.parametrize("ahead", [1, 90], ids=lambda v: f"ahead-{v}")
def test_future_version_asks_for_an_upgrade(ahead: int) -> None:
    # Runs are at MANIFEST_VERSION; parts at PACKED_VERSION when their small files are packed.
    with pytest.raises(ManifestError, match="upgrade") as run_err:
        parse_run_manifest(_run_manifest(version=MANIFEST_VERSION + ahead))
    with pytest.raises(ManifestError, match="upgrade") as part_err:
        parse_checkpoint_manifest(_checkpoint_manifest(7, version=PACKED_VERSION + ahead), 7)

    assert str(MANIFEST_VERSION + ahead) in str(run_err.value)
    assert str(PACKED_VERSION + ahead) in str(part_err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(_checkpoint_manifest(8, _file("a.bin")), "says step 8", id="wrong-step"),
        pytest.param(
            _checkpoint_manifest(7, epoch=2, rank=1),
            r"checkpoint-7/MANIFEST\.json says step 7, epoch 2, rank 1; expected 7, 0, 0",
            id="a-v2-part-where-v1-is-expected",
        ),
        pytest.param(
            _checkpoint_manifest(7, _file("a.bin"), _file("a.bin")),
            "lists a file twice",
            id="file-twice",
        ),
        pytest.param(
            _checkpoint_manifest(7, _file(CHECKPOINT_MANIFEST)), "lists itself", id="lists-itself"
        ),
        pytest.param(
            _checkpoint_manifest(7, _file("a.bin", size=-1)), "malformed", id="negative-size"
        ),
        pytest.param(b"[]", "JSON object", id="array-not-object"),
    ],
)
def test_checkpoint_manifest_refused(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_checkpoint_manifest(data, 7)


@pytest.mark.parametrize(
    ("epoch", "rank", "says"),
    [
        pytest.param(2, 1, "epoch 2, rank 1", id="other-epoch"),
        pytest.param(3, 0, "epoch 3, rank 0", id="other-rank"),
        pytest.param(0, 0, "epoch 0, rank 0", id="version-1-part"),
    ],
)
def test_part_of_another_epoch_or_rank_is_refused(epoch: int, rank: int, says: str) -> None:
    data = _checkpoint_manifest(7, _file("a.bin"), epoch=epoch, rank=rank, ranks=2)
    where = "checkpoints/checkpoint-7/e3/r1/MANIFEST.json"

    with pytest.raises(ManifestError, match=f"{where} says step 7, {says}; expected 7, 3, 1"):
        parse_checkpoint_manifest(data, 7, epoch=3, rank=1)
    assert parse_checkpoint_manifest(data, 7, epoch, rank).rank == rank


UNSAFE_NAMES = [
    pytest.param("../../x", id="parent-escape"),
    pytest.param("..", id="parent"),
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("a/../b", id="inner-parent"),
    pytest.param("a/..", id="trailing-parent"),
    pytest.param("a//b", id="double-slash"),
    pytest.param("", id="empty"),
    pytest.param(".", id="dot"),
    pytest.param("./a", id="leading-dot"),
    pytest.param("a/./b", id="inner-dot"),
    pytest.param("a/", id="trailing-slash"),
    pytest.param("a\\..\\..\\b", id="backslashes"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\nb", id="newline"),
    pytest.param("\x1b[31mred", id="terminal-escape"),
    pytest.param("a\u200bb", id="zero-width-space"),
    pytest.param("a\u2028b", id="line-separator"),
    pytest.param("a" * (MAX_NAME_BYTES + 1), id="256-bytes"),
    pytest.param("é" * 128, id="128-characters-of-256-bytes"),
]


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_file_name_refused(name: str) -> None:
    with pytest.raises(ManifestError):
        safe_relative_path(name)
    with pytest.raises(ManifestError, match="malformed"):
        parse_checkpoint_manifest(_checkpoint_manifest(7, _file("ok.bin"), _file(name)), 7)


# -- caps ---------------------------------------------------------------------------------


def _padded(data: bytes, size: int) -> bytes:
    """``data`` (a JSON object) grown to exactly ``size`` bytes by an extra key."""
    pad = size - len(data) - len(b', "pad": ""')
    return data[:-1] + b', "pad": "' + b"x" * pad + b'"}'


def _steps(count: int) -> bytes:
    return _run_manifest(*(_entry(s) for s in range(1, count + 1)))


def _files(count: int) -> bytes:
    return _checkpoint_manifest(7, *(_file(f"shard-{i}.bin") for i in range(count)))


def _values(field: str, count: int) -> bytes:
    """A manifest within the byte cap whose ``field`` decodes to ``count`` empty objects."""
    return b'{"version": 2, "step": 7, "created": "t", "%s": [%s]}' % (
        field.encode(),
        b",".join([b"{}"] * count),
    )


RUN_FIX = "put back a good copy"
PART_FIX = "save fewer files per rank"


@pytest.mark.parametrize(
    ("data", "message", "fix"),
    [
        pytest.param(
            _padded(_run_manifest(_entry(1)), RUN_MANIFEST_MAX_BYTES + 1),
            f"manifest.json is {RUN_MANIFEST_MAX_BYTES + 1} bytes, over the cap of "
            f"{RUN_MANIFEST_MAX_BYTES} bytes",
            RUN_FIX,
            id="run-manifest-over-4-MiB",
        ),
        pytest.param(
            _steps(MAX_ENTRIES + 1),
            "manifest.json lists 1001 checkpoints, over the cap of 1000",
            RUN_FIX,
            id="run-manifest-of-1001-checkpoints",
        ),
        pytest.param(
            _values("entries", 100_000),
            "manifest.json holds more JSON values than 1000 checkpoints can have",
            RUN_FIX,
            id="run-manifest-of-100k-objects-refused-before-decoding",
        ),
    ],
)
def test_run_manifest_over_a_cap_is_refused(data: bytes, message: str, fix: str) -> None:
    with pytest.raises(ManifestTooLarge) as e:
        parse_run_manifest(data)

    assert message in str(e.value)
    assert fix in str(e.value)
    assert isinstance(e.value, ManifestError)  # what every reader already handles


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            _padded(_checkpoint_manifest(7), CHECKPOINT_MANIFEST_MAX_BYTES + 1),
            f"checkpoint-7/MANIFEST.json is {CHECKPOINT_MANIFEST_MAX_BYTES + 1} bytes, over "
            f"the cap of {CHECKPOINT_MANIFEST_MAX_BYTES} bytes",
            id="part-over-8-MiB",
        ),
        pytest.param(
            _files(MAX_FILES + 1),
            "checkpoint-7/MANIFEST.json lists 10001 files, over the cap of 10000",
            id="part-of-10001-files",
        ),
        pytest.param(
            _values("files", 200_000),
            "checkpoint-7/MANIFEST.json holds more JSON values than 10000 files can have",
            id="part-of-200k-objects-refused-before-decoding",
        ),
    ],
)
def test_checkpoint_manifest_over_a_cap_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(ManifestTooLarge) as e:
        parse_checkpoint_manifest(data, 7)

    assert message in str(e.value)
    assert PART_FIX in str(e.value)


def test_manifests_at_the_caps_parse() -> None:
    assert len(parse_run_manifest(_steps(MAX_ENTRIES)).entries) == MAX_ENTRIES
    assert len(parse_checkpoint_manifest(_files(MAX_FILES), 7).files) == MAX_FILES
    run = _padded(_run_manifest(_entry(1)), RUN_MANIFEST_MAX_BYTES)
    part = _padded(_checkpoint_manifest(7, _file("a.bin")), CHECKPOINT_MANIFEST_MAX_BYTES)

    assert [e.step for e in parse_run_manifest(run).entries] == [1]
    assert [f.path for f in parse_checkpoint_manifest(part, 7).files] == ["a.bin"]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a" * MAX_NAME_BYTES, id="255-bytes"),
        pytest.param("é" * 127, id="127-characters-of-254-bytes"),
        pytest.param("global step 100/model-00001-of-00004.safetensors", id="with-spaces"),
        pytest.param("检查点/模型.pt", id="non-latin"),
    ],
)
def test_printable_names_within_255_bytes_are_accepted(name: str) -> None:
    data = _checkpoint_manifest(7, _file(name))

    assert safe_relative_path(name) == name
    assert [f.path for f in parse_checkpoint_manifest(data, 7).files] == [name]


# -- accepted manifests -------------------------------------------------------------------


def test_run_manifest_parses_and_ignores_extra_keys() -> None:
    data = _run_manifest(_entry(300), _entry(100), _entry(200, note="x"), latest=300, writer="s")

    m = parse_run_manifest(data)

    assert [e.step for e in m.entries] == [300, 100, 200]
    assert m.latest is not None
    assert m.latest.step == 300


def test_version_2_fields_parse() -> None:
    data = _run_manifest(
        _entry(100, 2, attempt=2, ranks=4), _entry(50), fence=3, fence_holder="uid-1/3"
    )

    m = parse_run_manifest(data)

    assert (m.version, m.fence, m.fence_holder) == (MANIFEST_VERSION, 3, "uid-1/3")
    e = m.entries[0]
    assert (e.epoch, e.attempt, e.ranks, e.prefix) == (2, 2, 4, "checkpoints/checkpoint-100/e2/")
    assert e.part_prefixes == [f"checkpoints/checkpoint-100/e2/r{r}/" for r in range(4)]
    assert m.entries[1].part_prefixes == ["checkpoints/checkpoint-50/"]
    assert parse_run_manifest(m.to_json()) == m
    part = _checkpoint_manifest(100, _file("a"), epoch=2, attempt=2, rank=3, ranks=4)
    p = parse_checkpoint_manifest(part, 100, epoch=2, rank=3)
    assert (p.epoch, p.attempt, p.rank, p.ranks) == (2, 2, 3, 4)


def test_version_1_manifests_still_parse() -> None:
    entry = {"step": 10, "prefix": "checkpoints/checkpoint-10/", "committed": "t"}
    data = json.dumps({"version": 1, "latest": 10, "entries": [{**entry, "files": 1, "bytes": 2}]})
    part = {"version": 1, "step": 10, "files": [_file("model.bin")], "created": "t"}

    m = parse_run_manifest(data.encode())
    p = parse_checkpoint_manifest(json.dumps(part).encode(), 10)

    assert (m.version, m.fence, m.fence_holder) == (1, 0, "")
    assert [(e.epoch, e.attempt, e.ranks) for e in m.entries] == [(0, 0, 1)]
    assert m.entries[0].part_prefixes == [checkpoint_prefix(10)]
    assert (p.version, p.epoch, p.attempt, p.rank, p.ranks) == (1, 0, 0, 0, 1)


def test_key_layout() -> None:
    assert checkpoint_prefix(7) == epoch_prefix(7, 0) == part_prefix(7, 0, 0)
    assert checkpoint_prefix(7) == "checkpoints/checkpoint-7/"
    assert epoch_prefix(7, 3) == "checkpoints/checkpoint-7/e3/"
    assert part_prefix(7, 3, 1) == "checkpoints/checkpoint-7/e3/r1/"
    with pytest.raises(ValueError, match="one part, rank 0"):
        part_prefix(7, 0, 1)


def test_empty_run_manifest_has_no_latest() -> None:
    m = parse_run_manifest(_run_manifest())

    assert (m.entries, m.latest) == ([], None)
    assert json.loads(m.to_json())["latest"] is None


def test_checkpoint_manifest_parses() -> None:
    data = _checkpoint_manifest(7, _file("model.safetensors", 1000), _file("opt/state.pt", 24))

    m = parse_checkpoint_manifest(data, 7)

    assert [f.path for f in m.files] == ["model.safetensors", "opt/state.pt"]
    assert m.total_bytes == 1024


@pytest.mark.parametrize(
    "name", ["model.safetensors", "opt/rank-0/state.pt", "..hidden", "a..b", ".cfg"]
)
def test_safe_file_names_accepted_unchanged(name: str) -> None:
    assert safe_relative_path(name) == name


# -- candidates and listings --------------------------------------------------------------


def test_candidates_newest_first_skipping_bad() -> None:
    m = _entries(100, 400, 200, 300)

    assert [e.step for e in candidates(m, {400, 200})] == [300, 100]
    assert [e.step for e in candidates(m, frozenset())] == [400, 300, 200, 100]
    assert candidates(m, {100, 200, 300, 400}) == []


def _checkpoint(*files: tuple[str, int]) -> CheckpointManifest:
    return parse_checkpoint_manifest(_checkpoint_manifest(7, *(_file(p, s) for p, s in files)), 7)


def test_listing_problems_names_missing_files_and_wrong_sizes() -> None:
    cp = _checkpoint(("model.bin", 100), ("opt.pt", 50), ("config.json", 2))

    problems = listing_problems(cp, {"model.bin": 100, "opt.pt": 49})

    assert problems == ["opt.pt has 49 bytes, manifest says 50", "config.json is missing"]


def test_complete_listing_has_no_problems_even_with_extra_objects() -> None:
    cp = _checkpoint(("model.bin", 100), ("empty.txt", 0))

    assert listing_problems(cp, {"model.bin": 100, "empty.txt": 0, "MANIFEST.json": 300}) == []


# -- properties ---------------------------------------------------------------------------

steps = st.lists(st.integers(min_value=0, max_value=10**12), unique=True, max_size=20)
entries = st.lists(
    st.builds(
        lambda step, epoch, ranks, committed, size: ManifestEntry(
            step=step,
            prefix=epoch_prefix(step, epoch),
            committed=committed,
            files=size % 1000,
            bytes=size,
            epoch=epoch,
            attempt=epoch,
            ranks=ranks if epoch else 1,
        ),
        st.integers(min_value=0, max_value=10**12),
        st.integers(min_value=0, max_value=9),
        st.integers(min_value=1, max_value=8),
        st.text(max_size=30),
        st.integers(min_value=0, max_value=10**15),
    ),
    unique_by=lambda e: e.step,
    max_size=20,
)


@given(entries, st.integers(min_value=9, max_value=10**6), st.text(max_size=20))
def test_run_manifest_round_trips(entries: list[ManifestEntry], fence: int, holder: str) -> None:
    m = RunManifest(entries=entries, fence=fence, fence_holder=holder)

    parsed = parse_run_manifest(m.to_json())

    assert parsed == m
    assert parsed.latest == m.latest


@given(steps, st.sets(st.integers(min_value=0, max_value=10**12)), st.data())
def test_candidates_sorted_descending_without_bad_steps(
    committed: list[int], other_bad: set[int], data: st.DataObject
) -> None:
    bad = set(data.draw(st.lists(st.sampled_from(committed)))) if committed else set()
    bad |= other_bad
    m = _entries(*committed)

    chosen = [e.step for e in candidates(m, bad)]

    assert chosen == sorted(chosen, reverse=True)
    assert not set(chosen) & bad
    assert set(chosen) == set(committed) - bad


# Tricky pieces more likely than random text to make an escaping path.
pieces = st.sampled_from(["a", "b", ".", "..", "...", "/", "//", "\\", "\x00", "~", " ", "é"])
tricky_paths = st.lists(pieces, max_size=10).map("".join)


@settings(max_examples=300)
@given(st.one_of(tricky_paths, st.text(max_size=40)))
def test_accepted_paths_never_escape_the_base(path: str) -> None:
    try:
        accepted = safe_relative_path(path)
    except ManifestError:
        return
    joined = posixpath.normpath(posixpath.join(BASE, accepted))

    assert joined.startswith(BASE + "/"), f"{path!r} resolves to {joined!r}, outside {BASE!r}"
    assert accepted == path == posixpath.normpath(path)


# Printable characters (neither control, format, private, unassigned nor separators); five
# segments of 12 characters of at most 4 bytes stay within MAX_NAME_BYTES.
segments = st.text(
    alphabet=st.characters(
        blacklist_characters="/\\\x00",
        blacklist_categories=["Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp", "Zs"],
    ),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))


@given(st.lists(segments, min_size=1, max_size=5).map("/".join))
def test_paths_of_ordinary_segments_are_accepted(path: str) -> None:
    assert safe_relative_path(path) == path


# -- with_committed, worth_uploading, same_files --------------------------------------------


def _one(step: int, committed: str = "2025-01-01T12:00:00Z") -> ManifestEntry:
    return ManifestEntry.model_validate(_entry(step, committed=committed))


small_steps = st.lists(st.integers(min_value=0, max_value=60), unique=True, max_size=12)
keeps = st.integers(min_value=1, max_value=8)


@settings(max_examples=200)
@given(small_steps, st.integers(min_value=0, max_value=60), keeps, st.booleans())
def test_with_committed_keeps_the_newest_steps(
    existing: list[int], step: int, keep: int, empty_as_none: bool
) -> None:
    manifest = None if empty_as_none and not existing else _entries(*existing)
    entry = _one(step, committed="now")

    updated, dropped = with_committed(manifest, entry, keep)

    if step in existing:  # committed once: nothing changes
        assert (updated.entries, dropped) == (_entries(*existing).entries, [])
        assert updated.version == MANIFEST_VERSION
        return
    every = set(existing) | {step}
    kept = [e.step for e in updated.entries]
    assert kept == sorted(kept), "entries stay in step order"
    assert len(kept) == len(set(kept)) == min(keep, len(every))
    assert set(kept) == set(sorted(every)[-keep:])
    assert set(kept) | {e.step for e in dropped} == every
    assert not set(kept) & {e.step for e in dropped}
    newer = sum(1 for s in every if s > step)
    assert (entry in updated.entries) == (newer < keep)
    assert parse_run_manifest(updated.to_json()).entries == updated.entries


@pytest.mark.parametrize(
    "again",
    [
        pytest.param(_one(20, committed="later"), id="same-epoch-later"),
        pytest.param(ManifestEntry.model_validate(_entry(20, 3, ranks=2)), id="newer-epoch"),
    ],
)
def test_a_committed_step_is_never_replaced(again: ManifestEntry) -> None:
    before = _entries(10, 20, 30)

    updated, dropped = with_committed(before, again, keep=3)

    assert updated.entries == before.entries
    assert dropped == []


@pytest.mark.parametrize("keep", [0, -1], ids=["keep-zero", "keep-negative"])
def test_with_committed_refuses_keep_below_one(keep: int) -> None:
    with pytest.raises(ValueError, match="keep must be at least 1"):
        with_committed(None, _one(1), keep)


@settings(max_examples=200)
@given(small_steps, st.integers(min_value=0, max_value=60), keeps)
def test_worth_uploading_agrees_with_retention(committed: list[int], step: int, keep: int) -> None:
    assume(step not in committed)
    # A manifest only ever holds `keep` entries; worth_uploading sees the sidecar's list of it.
    committed = sorted(committed)[-keep:]

    updated, _ = with_committed(_entries(*committed), _one(step), keep)

    survives = any(e.step == step for e in updated.entries)
    assert worth_uploading(step, committed, keep) == survives


@given(small_steps.filter(bool), keeps, st.data())
def test_a_committed_step_is_never_worth_uploading_again(
    committed: list[int], keep: int, data: st.DataObject
) -> None:
    step = data.draw(st.sampled_from(committed))

    assert not worth_uploading(step, committed, keep)


def _ckpt(step: int, *files: tuple[str, int, str, str], created: str = "t0") -> CheckpointManifest:
    return CheckpointManifest(
        version=MANIFEST_VERSION,
        step=step,
        files=[
            {"path": p, "size": n, "checksum_algorithm": a, "checksum": c}  # type: ignore[misc]
            for p, n, a, c in files
        ],
        created=created,
    )


BASE_FILES = (("model.bin", 100, "CRC64NVME", "AAAAAAAAAAA="), ("opt.pt", 5, "CRC64NVME", "AQ=="))


@pytest.mark.parametrize(
    ("other", "same"),
    [
        pytest.param(_ckpt(7, *BASE_FILES, created="t1"), True, id="only-created-differs"),
        pytest.param(_ckpt(7, *reversed(BASE_FILES)), True, id="other-file-order"),
        pytest.param(_ckpt(8, *BASE_FILES), False, id="other-step"),
        pytest.param(_ckpt(7, *BASE_FILES).model_copy(update={"epoch": 1}), False, id="epoch"),
        pytest.param(_ckpt(7, *BASE_FILES).model_copy(update={"rank": 1}), False, id="rank"),
        pytest.param(_ckpt(7, *BASE_FILES).model_copy(update={"ranks": 2}), False, id="ranks"),
        pytest.param(_ckpt(7, *BASE_FILES).model_copy(update={"attempt": 2}), True, id="attempt"),
        pytest.param(_ckpt(7, BASE_FILES[0]), False, id="file-missing"),
        pytest.param(
            _ckpt(7, BASE_FILES[0], ("opt.pt", 6, "CRC64NVME", "AQ==")), False, id="other-size"
        ),
        pytest.param(
            _ckpt(7, BASE_FILES[0], ("opt.pt", 5, "CRC64NVME", "Ag==")), False, id="other-checksum"
        ),
        pytest.param(
            _ckpt(7, BASE_FILES[0], ("opt.pt", 5, "CRC32C", "AQ==")), False, id="other-algorithm"
        ),
        pytest.param(
            _ckpt(7, BASE_FILES[0], ("opt2.pt", 5, "CRC64NVME", "AQ==")), False, id="renamed"
        ),
    ],
)
def test_same_files(other: CheckpointManifest, same: bool) -> None:
    base = _ckpt(7, *BASE_FILES)

    assert same_files(base, other) is same
    assert same_files(other, base) is same


# -- the parsers raise only ManifestError ---------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
entry_like = st.fixed_dictionaries(
    {},
    optional={
        "step": json_values,
        "prefix": st.sampled_from(["checkpoints/checkpoint-1/", "x", ""]) | json_values,
        "committed": json_values,
        "files": json_values,
        "bytes": json_values,
        "path": st.sampled_from(["a", "../a", "/a", "a\\b", "a\x00"]) | json_values,
        "size": json_values,
        "checksum_algorithm": json_values,
        "checksum": json_values,
    },
)
versioned_objects = st.fixed_dictionaries(
    {"version": st.just(MANIFEST_VERSION)},
    optional={
        "entries": st.lists(entry_like, max_size=3) | json_values,
        "files": st.lists(entry_like, max_size=3) | json_values,
        "step": st.sampled_from([7, -7]) | json_values,
        "created": json_values,
        "fence": st.sampled_from([0, 3, -1]) | json_values,
        "epoch": st.sampled_from([0, 3, -1]) | json_values,
        "rank": st.sampled_from([0, 1]) | json_values,
        "ranks": st.sampled_from([0, 2]) | json_values,
    },
)


def _only_manifest_errors(data: bytes) -> None:
    parsers = (
        parse_run_manifest,
        lambda d: parse_checkpoint_manifest(d, 7),
        lambda d: parse_checkpoint_manifest(d, 7, 3, 1),
    )
    for parse in parsers:
        with contextlib.suppress(ManifestError):
            parse(data)


@settings(max_examples=150)
@given(
    st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        versioned_objects.map(lambda v: json.dumps(v).encode()),
    )
)
def test_parsers_raise_only_manifest_error(data: bytes) -> None:
    _only_manifest_errors(data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"[" * 100_000, id="deeply-nested-array"),
        pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, id="deeply-nested-object"),
        pytest.param(b'{"version": ' + b"1" * 5000 + b"}", id="version-past-digit-limit"),
        pytest.param(
            b'{"version": 1, "step": ' + b"9" * 5000 + b', "entries": []}',
            id="step-past-digit-limit",
        ),
        pytest.param(b'{"version": 1e999}', id="version-infinite"),
        pytest.param(b'{"version": NaN}', id="version-nan"),
        pytest.param(b'{"version": 1, "step": Infinity, "files": []}', id="step-infinite"),
        pytest.param(b"\xef\xbb\xbf{}", id="utf8-bom"),
        pytest.param('{"version": 1}'.encode("utf-16"), id="utf-16"),
        pytest.param(b"\x00" * 8, id="nul-bytes"),
    ],
)
def test_crafted_inputs_raise_only_manifest_error(data: bytes) -> None:
    _only_manifest_errors(data)
