"""``trainingrun``: one command, one subcommand per part.

- ``trainingrun operator``: the controller (kopf).
- ``trainingrun crd``: print the CustomResourceDefinition.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import sys

from trainingrun import __version__


def _limit_malloc_arenas() -> None:
    """glibc gives each thread that allocates its own malloc arena (up to 8 per core); with the
    operator's worker threads that multiplies RSS for no gain. Two arenas are plenty."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc
    m_arena_max = -8
    libc.mallopt(m_arena_max, 2)


def _operator(args: argparse.Namespace) -> int:
    import kopf

    _limit_malloc_arenas()

    from trainingrun import controller  # registers the handlers

    del controller
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # kopf logs every handler call at INFO
        logging.getLogger("kopf").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        standalone=not args.peering,
        peering_name=args.peering or None,
        liveness_endpoint=args.liveness or None,
    )
    return 0


def _crd(_: argparse.Namespace) -> int:
    from trainingrun.crd import render

    sys.stdout.write(render())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trainingrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trainingrun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the operator")
    op.add_argument("--namespace", action="append", help="watch only these namespaces")
    op.add_argument("--peering", default="", help="kopf peering name (for safe upgrades)")
    op.add_argument(
        "--liveness", default="", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    op.add_argument("-v", "--verbose", action="store_true")
    op.set_defaults(func=_operator)

    crd = sub.add_parser("crd", help="print the TrainingRun CRD")
    crd.set_defaults(func=_crd)

    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
