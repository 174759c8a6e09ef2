"""The verl-hyperlight command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-hyperlight",
        description="Run verl's code-reward test cases in local Hyperlight micro-VMs.",
    )
    parser.add_argument("--version", action="version", version=f"verl-hyperlight {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    _parser().parse_args(argv)
    return 0
