"""Where the restore puts each file (trainingrun.agent.restore.target_path).

Covers:

- names that could escape the checkpoint folder (``..`` parts, absolute, backslash, NUL, empty,
  ``.``, double slashes, a trailing slash) are refused with CheckpointBad, both as fixed cases and
  as hypothesis-generated names that contain one of those pieces anywhere;
- a name that passes always resolves to a path inside the folder, and keeps its segments;
- a symlink inside the folder that points outside is caught by the resolved-path check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainingrun.agent.restore import CheckpointBad, target_path

FIXED_UNSAFE = [
    pytest.param("../x", id="parent"),
    pytest.param("a/../../x", id="inner-parent-escape"),
    pytest.param("..", id="dot-dot"),
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("a\\..\\..\\x", id="backslashes"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("", id="empty"),
    pytest.param(".", id="dot"),
    pytest.param("a//b", id="double-slash"),
    pytest.param("a/", id="trailing-slash"),
]


@pytest.mark.parametrize("name", FIXED_UNSAFE)
def test_unsafe_names_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(CheckpointBad, match="file name"):
        target_path(tmp_path, name)


plain = st.text(
    alphabet=st.characters(blacklist_characters="/\\\x00", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", ".."))
poison = st.sampled_from(["..", "\\", "\x00", "/", ""])


@st.composite
def poisoned_names(draw: st.DrawFn) -> str:
    """Ordinary segments with one escaping piece put in as a segment, a prefix or a suffix."""
    segments = draw(st.lists(plain, max_size=4))
    at = draw(st.integers(0, len(segments)))
    bad = draw(poison)
    where = draw(st.sampled_from(["segment", "absolute", "inside"]))
    if where == "absolute":
        return "/" + "/".join(segments)
    if where == "inside" and bad in ("\\", "\x00") and segments:
        i = at % len(segments)
        segments[i] = segments[i][:1] + bad + segments[i][1:]
        return "/".join(segments)
    segments.insert(at, bad)
    return "/".join(segments)


FIXTURE_OK = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FIXTURE_OK
@given(poisoned_names())
def test_generated_escaping_names_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointBad):
        target_path(tmp_path, name)


@FIXTURE_OK
@given(st.one_of(st.lists(plain, min_size=1, max_size=5).map("/".join), st.text(max_size=30)))
def test_accepted_names_resolve_inside_the_folder(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "staging"
    try:
        path = target_path(folder, name)
    except CheckpointBad:
        return
    assert path.is_relative_to(folder.resolve())
    assert path != folder.resolve()
    assert path.relative_to(folder.resolve()).as_posix() == name


def test_symlink_out_of_the_folder_is_caught(tmp_path: Path) -> None:
    folder = tmp_path / "staging"
    outside = tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    (folder / "link").symlink_to(outside, target_is_directory=True)

    with pytest.raises(CheckpointBad, match="escapes the checkpoint folder"):
        target_path(folder, "link/model.bin")
    assert target_path(folder, "sub/model.bin") == folder.resolve() / "sub" / "model.bin"
