"""The verl-hyperlight command: prepare a node, or run one case by hand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import __version__, _hluk, _warmup
from ._api import run_code
from ._errors import BackendError, InvalidRequest
from ._guest import guest_for


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-hyperlight",
        description="Run verl's code-reward test cases in local Hyperlight micro-VMs.",
    )
    parser.add_argument("--version", action="version", version=f"verl-hyperlight {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    warm = commands.add_parser(
        "warm-up",
        help="pull the image and take the warm snapshot on this node (once per node)",
        description="Pull the image and take the warm snapshot, as a reward worker does before "
        "its first case; run it once per node before training to keep that out of step one.",
    )
    warm.add_argument("url", nargs="?", default="hyperlight://", help="sandbox URL")
    warm.add_argument(
        "--memory-limit-mb", type=int, default=1024, help="verl's memory_limit_mb (default 1024)"
    )
    run = commands.add_parser(
        "run",
        help="run one solution file on stdin and print the Sandbox Fusion response",
        description="Run SOLUTION (a Python file) with this command's standard input as its "
        "input, and print the response verl would receive, as JSON.",
    )
    # Bytes: the solution and its input reach the guest as written (\r\n stays \r\n).
    run.add_argument("solution", type=argparse.FileType("rb"))
    run.add_argument("--url", default="hyperlight://", help="sandbox URL")
    run.add_argument("--timeout", type=float, default=10.0, help="run_timeout in seconds")
    run.add_argument("--memory-limit-mb", type=int, default=1024)
    return parser


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _how(warmth: _warmup.Warmth | None) -> str:
    if warmth is None or warmth.restored is None:
        return ""
    if warmth.restored:
        return f" (its warm snapshot restored in {warmth.seconds * 1000:.0f} ms)"
    return f" (pulled and snapshotted in {warmth.seconds:.1f} s)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "warm-up":
        try:
            guest = guest_for(args.url, args.memory_limit_mb)
            warmth = _warmup.ensure_ready(_hluk.hluk_path(), guest)
        except (InvalidRequest, BackendError) as exc:
            print(f"verl-hyperlight: {exc}", file=sys.stderr)
            return 1
        print(f"{guest.image.label} is warm on this node{_how(warmth)}")
        return 0
    if args.command == "run":
        try:
            code = _text(args.solution.read(), args.solution.name)
            stdin = _text(sys.stdin.buffer.read(), "standard input")
        except ValueError as exc:
            print(f"verl-hyperlight: {exc}", file=sys.stderr)
            return 1
        response, error = run_code(args.url, code, stdin, 10, args.timeout, args.memory_limit_mb)
        if error is not None:
            print(f"verl-hyperlight: {error}", file=sys.stderr)
            return 1
        print(json.dumps(response, indent=2))
        return 0 if response and response["status"] != "SandboxError" else 1
    parser.print_help()
    return 0
