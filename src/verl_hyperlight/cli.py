"""The verl-hyperlight command: prepare a node, run one case by hand, or serve Sandbox
Fusion's HTTP API."""

from __future__ import annotations

import argparse
import json
import logging
import os
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
    serve = commands.add_parser(
        "serve",
        help="answer Sandbox Fusion's HTTP API (POST /run_code) from micro-VMs",
        description="Serve Sandbox Fusion's API (POST /run_code, GET /v1/ping) from this "
        "node's micro-VMs, plus GET /readyz and /metrics. Needs the serve extra: pip install "
        "'verl-hyperlight[serve]'. The API has no authentication of its own: it binds the "
        "loopback address unless told otherwise; VERL_HYPERLIGHT_TOKEN, when set, is a bearer "
        "token every /run_code request must carry.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (8080)")
    serve.add_argument("--url", default="hyperlight://", help="sandbox URL the cases run with")
    serve.add_argument(
        "--max-concurrent",
        type=_positive_int,
        default=None,
        help="micro-VMs at once (default: the CPUs this process may use)",
    )
    serve.add_argument(
        "--max-queue",
        type=_positive_int,
        default=None,
        help="requests that may wait for a micro-VM (default: 8 x max-concurrent)",
    )
    serve.add_argument(
        "--max-wait",
        type=float,
        default=5.0,
        help="seconds a request waits for a micro-VM before HTTP 504 (default 5; never more "
        "than its compile_timeout + 5)",
    )
    serve.add_argument(
        "--max-body-mb", type=_positive_int, default=64, help="largest request body (64 MiB)"
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds in-flight cases get to finish on SIGTERM (default 30)",
    )
    serve.add_argument(
        "--memory-limit-mb",
        type=int,
        default=1024,
        help="the memory limit whose guest is warmed up at start (verl's default, 1024)",
    )
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


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
    if args.command == "serve":
        return _serve(args)
    parser.print_help()
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from . import serve
    except ImportError as exc:
        print(
            f"verl-hyperlight: serve needs its extra ({exc.name} is missing): "
            "pip install 'verl-hyperlight[serve]'",
            file=sys.stderr,
        )
        return 1
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    defaults = serve.Settings()
    settings = serve.Settings(
        url=args.url,
        max_concurrent=args.max_concurrent or defaults.max_concurrent,
        max_queue=args.max_queue,
        max_wait=args.max_wait,
        max_body_bytes=args.max_body_mb * 1024 * 1024,
        grace=args.grace,
        warm_up_memory_mb=args.memory_limit_mb,
        token=os.environ.get("VERL_HYPERLIGHT_TOKEN") or None,
    )
    serve.serve(settings, args.host, args.port)
    return 0
