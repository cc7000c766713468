"""``trainingrun --help`` and each subcommand's ``--help``, as users read them.

Covers: the overview names every subcommand argparse accepts, each on one line with what it is
for, under the group of people who run it (users; inside the training pods; the operator's
Deployment; developers); every subcommand's own help has examples or its exit codes; no help
text holds reStructuredText's double backticks, a dotted name of the package's modules or a
constant of the contract module; ``kubectl trainingrun --help`` says the same as
``trainingrun --help``, with its examples as kubectl users type them; and the options still
parse to what the subcommands read (the help changed, the command line did not).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from trainingrun import cli, contract
from trainingrun.cli import helptext
from trainingrun.cli.commandline import build_parser

# Written out here rather than read from helptext: a subcommand dropped from the help shows.
SUBCOMMANDS = {
    "checkpoints list": helptext.USERS,
    "status": helptext.USERS,
    "sync": helptext.PODS,
    "restore": helptext.PODS,
    "operator": helptext.OPERATOR,
    "crd": helptext.DEVELOPERS,
}
ONE_LINE = {c.name: c.line for c in helptext.COMMANDS}
# trainingrun.operator.handlers, contract.STORE_CREDENTIAL_KEYS, decide.pod: not for users
MODULE_NAME = re.compile(
    r"(?<![\w./])(trainingrun|contract|decide|storage|agent|operator|checkpoint|api|cli)"
    r"\.[a-z_]"
)


def _help(argv: list[str], capsys: pytest.CaptureFixture[str], prog: str = "trainingrun") -> str:
    with pytest.raises(SystemExit) as ended:
        build_parser(prog, {name: _never for name in SUBCOMMANDS}).parse_args(argv)
    assert ended.value.code == 0
    return capsys.readouterr().out


def _never(_: argparse.Namespace) -> int:
    raise AssertionError("--help runs no subcommand")


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps the options to the terminal


def test_every_command_has_its_one_line_under_its_group(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["--help"], capsys)
    lines = text.splitlines()
    assert set(ONE_LINE) == set(SUBCOMMANDS)
    for name, group in SUBCOMMANDS.items():
        mine = [i for i, line in enumerate(lines) if line.lstrip().startswith(name + " ")]
        assert len(mine) == 1, f"{name!r} is on {len(mine)} lines of the overview"
        (row,) = mine
        assert lines[row].rstrip().endswith(ONE_LINE[name])
        heading = max(i for i, line in enumerate(lines[:row]) if line in helptext.GROUPS)
        assert lines[heading] == group, f"{name!r} is listed under {lines[heading]!r}"


def test_the_overview_lists_what_argparse_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command's error names the accepted ones: exactly the documented ones."""
    with pytest.raises(SystemExit):
        build_parser("trainingrun", {name: _never for name in SUBCOMMANDS}).parse_args(["nope"])
    accepted = set(re.findall(r"'(\w+)'", capsys.readouterr().err.split("choose from")[1]))
    assert accepted == {name.split()[0] for name in SUBCOMMANDS}


@pytest.mark.parametrize("command", [*SUBCOMMANDS, "checkpoints", ""], ids=repr)
def test_no_help_holds_developers_words(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help([*command.split(), "--help"], capsys)
    assert "``" not in text
    assert not MODULE_NAME.findall(text), MODULE_NAME.findall(text)
    constants = {name for name in vars(contract) if name.isupper() and len(name) > 3}
    assert not [name for name in constants if re.search(rf"\b{name}\b", text)]


@pytest.mark.parametrize("command", list(SUBCOMMANDS), ids=repr)
def test_each_command_says_what_it_is_for_and_shows_how(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help([*command.split(), "--help"], capsys)
    description = text.split("\n\n")[1]
    assert len(description.split()) >= 10, "a description of its own, above the options"
    assert "examples:" in text or "exit codes" in text


def test_kubectl_plugin_shows_the_same_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    direct = _help(["--help"], capsys)
    monkeypatch.setattr(sys, "argv", ["kubectl-trainingrun", "--help"])
    with pytest.raises(SystemExit):
        cli.kubectl_plugin()
    plugin = capsys.readouterr().out
    assert plugin == direct.replace("trainingrun", "kubectl trainingrun").replace(
        "kubectl kubectl trainingrun", "kubectl trainingrun"
    )
    assert "  kubectl trainingrun status my-run -n team-a" in plugin


def _chosen(_: argparse.Namespace) -> int:
    return 0


@pytest.mark.parametrize(
    ("command", "argv", "parsed"),
    [
        pytest.param(
            "status",
            ["status", "r1", "-n", "team-a"],
            {"command": "status", "run": "r1", "namespace": "team-a", "kubeconfig": None},
            id="status",
        ),
        pytest.param(
            "checkpoints list",
            ["checkpoints", "list", "r1", "--kubeconfig", "k"],
            {"checkpoints_command": "list", "run": "r1", "namespace": None, "kubeconfig": "k"},
            id="checkpoints-list",
        ),
        pytest.param(
            "operator",
            ["operator", "--namespace", "a", "--namespace", "b", "--leader-lease", "ns/l", "-v"],
            {"namespace": ["a", "b"], "leader_lease": "ns/l", "verbose": True, "metrics_port": 0},
            id="operator",
        ),
        pytest.param("sync", ["sync", "-v"], {"command": "sync", "verbose": True}, id="sync"),
        pytest.param("restore", ["restore"], {"verbose": False}, id="restore"),
        pytest.param("crd", ["crd"], {"command": "crd"}, id="crd"),
    ],
)
def test_the_options_parse_as_before(
    command: str, argv: list[str], parsed: dict[str, object]
) -> None:
    handlers = {name: _never for name in SUBCOMMANDS} | {command: _chosen}
    args = build_parser("trainingrun", handlers).parse_args(argv)
    assert {key: getattr(args, key) for key in parsed} == parsed
    assert args.func is _chosen, "the subcommand's own function runs"


def test_python_dash_m_runs_the_command() -> None:
    """``python -m trainingrun.cli`` (how the tests start the operator) is the command."""
    done = subprocess.run(
        [sys.executable, "-m", "trainingrun.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("trainingrun "), done.stdout
