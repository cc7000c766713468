"""The bucket manifests: parsing, validation, the choice of candidates and listing checks.

Covers:

- parse_run_manifest / parse_checkpoint_manifest refuse with ManifestError: malformed JSON,
  bytes that are not UTF-8, a non-object, a missing or non-integer version, a future version
  (the message says to upgrade), duplicate steps, a prefix that does not match the step, a
  negative step, a wrong step in a checkpoint manifest, a file listed twice, the manifest
  listing itself, and unsafe file names ("../../x", "/etc/passwd", "a/../b", "a//b", "" ...);
- well-formed manifests parse, extra keys are ignored, ``latest`` is the newest step whatever
  the order, totals add up;
- candidates(): newest first, skipping bad steps;
- listing_problems(): missing files and wrong sizes are named, extra objects are not problems;
- properties (hypothesis): RunManifest.to_json -> parse_run_manifest round-trips the entries;
  candidates() is sorted descending and never holds a bad step; safe_relative_path() never
  accepts a path whose normalised join with a base leaves the base, and accepts every path
  made of ordinary segments;
- with_committed() (hypothesis): keeps exactly the newest min(keep, n) distinct steps, kept and
  dropped partition every step, the committed entry survives unless ``keep`` newer steps exist,
  re-committing a step replaces its entry, and the result round-trips through JSON; keep < 1 is
  refused; worth_uploading() agrees with it (a step worth uploading survives retention right
  after its commit, one that is not would be dropped at once);
- same_files(): creation time aside, any difference in path, size, algorithm, checksum or step
  counts;
- the parsers raise only ManifestError, never another exception, for arbitrary bytes, arbitrary
  JSON, arbitrary JSON objects with a valid version, and crafted inputs (deep nesting, integers
  past Python's digit limit, a UTF-8 BOM, UTF-16).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainingrun.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    CheckpointManifest,
    ManifestEntry,
    ManifestError,
    RunManifest,
    candidates,
    checkpoint_prefix,
    listing_problems,
    parse_checkpoint_manifest,
    parse_run_manifest,
    safe_relative_path,
    same_files,
    with_committed,
    worth_uploading,
)

BASE = "/checkpoints/checkpoint-7"


def _entry(step: int, **overrides: Any) -> dict[str, Any]:
    return {
        "step": step,
        "prefix": checkpoint_prefix(step),
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


@pytest.mark.parametrize("version", [MANIFEST_VERSION + 1, 99], ids=lambda v: f"version-{v}")
def test_future_version_asks_for_an_upgrade(version: int) -> None:
    with pytest.raises(ManifestError, match="upgrade") as run_err:
        parse_run_manifest(_run_manifest(version=version))
    with pytest.raises(ManifestError, match="upgrade"):
        parse_checkpoint_manifest(_checkpoint_manifest(7, version=version), 7)

    assert str(version) in str(run_err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(_checkpoint_manifest(8, _file("a.bin")), "says step 8", id="wrong-step"),
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
]


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_file_name_refused(name: str) -> None:
    with pytest.raises(ManifestError):
        safe_relative_path(name)
    with pytest.raises(ManifestError, match="malformed"):
        parse_checkpoint_manifest(_checkpoint_manifest(7, _file("ok.bin"), _file(name)), 7)


# -- accepted manifests -------------------------------------------------------------------


def test_run_manifest_parses_and_ignores_extra_keys() -> None:
    data = _run_manifest(_entry(300), _entry(100), _entry(200, note="x"), latest=300, writer="s")

    m = parse_run_manifest(data)

    assert [e.step for e in m.entries] == [300, 100, 200]
    assert m.latest is not None
    assert m.latest.step == 300


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
        lambda step, committed, files, size: ManifestEntry(
            step=step,
            prefix=checkpoint_prefix(step),
            committed=committed,
            files=files,
            bytes=size,
        ),
        st.integers(min_value=0, max_value=10**12),
        st.text(max_size=30),
        st.integers(min_value=0, max_value=10**6),
        st.integers(min_value=0, max_value=10**15),
    ),
    unique_by=lambda e: e.step,
    max_size=20,
)


@given(entries)
def test_run_manifest_round_trips(entries: list[ManifestEntry]) -> None:
    m = RunManifest(entries=entries)

    parsed = parse_run_manifest(m.to_json())

    assert parsed.entries == m.entries
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


segments = st.text(
    alphabet=st.characters(blacklist_characters="/\\\x00", blacklist_categories=["Cs"]),
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

    every = set(existing) | {step}
    kept = [e.step for e in updated.entries]
    assert kept == sorted(kept), "entries stay in step order"
    assert len(kept) == len(set(kept)) == min(keep, len(every))
    assert set(kept) == set(sorted(every)[-keep:])
    assert set(kept) | {e.step for e in dropped} == every
    assert not set(kept) & {e.step for e in dropped}
    newer = sum(1 for s in every if s > step)
    assert (entry in updated.entries) == (newer < keep)
    assert all(e.committed != "now" for e in dropped if e.step != step)
    assert parse_run_manifest(updated.to_json()).entries == updated.entries


def test_recommitting_a_step_replaces_its_entry() -> None:
    before = _entries(10, 20, 30)

    updated, dropped = with_committed(before, _one(20, committed="later"), keep=3)

    assert [e.step for e in updated.entries] == [10, 20, 30]
    assert [e.committed for e in updated.entries if e.step == 20] == ["later"]
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
    },
)


def _only_manifest_errors(data: bytes) -> None:
    for parse in (parse_run_manifest, lambda d: parse_checkpoint_manifest(d, 7)):
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
