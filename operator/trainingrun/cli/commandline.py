"""The command line of ``trainingrun``: its subcommands, their options and their help.

``build_parser`` takes the function that runs each subcommand, so this module holds no program
and imports none; the words users read come from ``cli.helptext``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from trainingrun import __version__
from trainingrun.cli import helptext as h

Handler = Callable[[argparse.Namespace], int]
RAW = argparse.RawDescriptionHelpFormatter  # the help texts are laid out by hand


def build_parser(prog: str, handlers: Mapping[str, Handler]) -> argparse.ArgumentParser:
    """The parser; ``handlers`` maps each ``helptext.Command.name`` to the function that runs
    it, set as the parsed arguments' ``func``. ``prog`` is the command as typed
    (``trainingrun`` or ``kubectl trainingrun``), in the usage lines and the examples."""

    def add(parent: Any, command: h.Command, **kwargs: Any) -> argparse.ArgumentParser:
        name = command.name.split()[-1]  # "checkpoints list": "list", under "checkpoints"
        sub: argparse.ArgumentParser = parent.add_parser(
            name,
            description=command.description.format(prog=prog),
            epilog=command.examples.format(prog=prog) or None,
            formatter_class=RAW,
            **kwargs,
        )
        sub.set_defaults(func=handlers[command.name])
        return sub

    top = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description=h.overview(prog),
        epilog=h.EPILOG.format(prog=prog),
        formatter_class=RAW,
    )
    top.add_argument("--version", action="version", version=f"trainingrun {__version__}")
    # The overview lists the commands by who runs them; argparse's own list would repeat them.
    sub = top.add_subparsers(
        dest="command", required=True, metavar="COMMAND", prog=prog, help=argparse.SUPPRESS
    )
    op = add(sub, h.OPERATOR_COMMAND)
    _operator_options(op)
    for agent in (op, add(sub, h.SYNC), add(sub, h.RESTORE)):
        agent.add_argument("-v", "--verbose", action="store_true", help=h.VERBOSE_OPTION)

    checkpoints = sub.add_parser(
        "checkpoints", description=h.CHECKPOINTS_GROUP, formatter_class=RAW
    )
    checkpoints_sub = checkpoints.add_subparsers(
        dest="checkpoints_command", required=True, metavar="COMMAND"
    )
    for user in (
        add(checkpoints_sub, h.CHECKPOINTS_LIST, help=h.CHECKPOINTS_LIST.line),
        add(sub, h.STATUS),
    ):
        user.add_argument("run", metavar="RUN", help=h.RUN_ARGUMENT)
        user.add_argument("-n", "--namespace", help=h.NAMESPACE_OPTION)
        user.add_argument("--kubeconfig", metavar="FILE", help=h.KUBECONFIG_OPTION)

    add(sub, h.CRD)
    return top


def _operator_options(op: argparse.ArgumentParser) -> None:
    op.add_argument("--namespace", action="append", help="watch only these namespaces")
    op.add_argument("--peering", default="", help="kopf peering name (for safe upgrades)")
    op.add_argument(
        "--liveness", default="", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    op.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)"
    )
    op.add_argument("--metrics-address", default="0.0.0.0", help="address of the metrics server")  # noqa: S104
    op.add_argument(
        "--leader-lease",
        default="",
        metavar="NAMESPACE/NAME",
        help="run only while holding this coordination.k8s.io Lease (several replicas, one "
        "acting; the others take over within about 12 s)",
    )
