"""The ``hvdx`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main"]


def _info(args: argparse.Namespace) -> int:
    from hvdx.info import collect, render

    print(render(collect()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdx", description="Network-aware synchronization for Horovod.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions of hvdx, Horovod, frameworks and MPI; "
                                       "whether network emulation is available")
    info.set_defaults(func=_info)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
