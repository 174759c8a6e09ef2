"""The verl-hyperlight command: prepare a node, run one case by hand, or serve Sandbox
Fusion's HTTP API."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TypeAlias

from . import __version__, diagnosis, node, settings
from .case import cluster, compiled
from .case.api import RUNS, SANDBOX_FUSION_LANGUAGES, run_code, warm_up
from .case.guests import LANGUAGE_IMAGES, Guest, guest_for
from .case.url import is_http, parse_url
from .case.warmup import Warmth
from .commands.progress import progress
from .errors import BackendError, InvalidRequest
from .hluk.spawn import raise_descriptor_limit
from .settings import TOKEN, ServeSettings, memory_limit_refusal

# What each command's parser is added to (argparse's type for it, generic only to checkers).
_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-hyperlight",
        description="Run verl's code-reward test cases in local Hyperlight micro-VMs.",
    )
    parser.add_argument("--version", action="version", version=f"verl-hyperlight {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (
        _add_warm_up,
        _add_run,
        _add_bench,
        _add_doctor,
        _add_selftest,
        _add_serve,
    ):
        add(commands)
    for command in commands.choices.values():
        # What the checks after parsing refuse is that command's usage error (exit 2).
        command.set_defaults(usage=command)
    return parser


# The sandbox URL every command takes when it is given none.
DEFAULT_URL = "hyperlight://"


def _add_url(
    command: argparse.ArgumentParser, help: str = "sandbox URL", *, positional: bool = True
) -> None:
    """Every command takes its sandbox URL as --url; those that took it as their one positional
    argument still do (`doctor hyperlight://?ray` as `doctor --url hyperlight://?ray`)."""
    command.add_argument("--url", default=None, help=f"{help} (default {DEFAULT_URL})")
    if positional:
        command.add_argument(
            "positional_url", nargs="?", default=None, metavar="URL", help="the same, as --url"
        )


def _url_of(args: argparse.Namespace) -> None:
    """args.url: --url or the positional URL (a usage error when both say different things),
    else the default."""
    given = {url for url in (args.url, getattr(args, "positional_url", None)) if url is not None}
    if len(given) > 1:
        args.usage.error(f"two sandbox URLs: --url {args.url} and {args.positional_url}")
    args.url = given.pop() if given else DEFAULT_URL


def _add_warm_up(commands: _Commands) -> None:
    warm = commands.add_parser(
        "warm-up",
        help="pull the image and take the warm snapshot on this node (once per node)",
        description="Pull the image and take the warm snapshot, as a reward worker does before "
        "its first case; run it once per node before training to keep that out of step one.",
    )
    _add_url(warm)
    warm.add_argument(
        "--memory-limit-mb",
        type=_memory_limit,
        default=1024,
        help="verl's memory_limit_mb (default 1024)",
    )
    warm.add_argument(
        "--language",
        choices=("python", *LANGUAGE_IMAGES),
        default="python",
        help="warm the image of this language's cases (default python: the URL's image)",
    )


def _add_run(commands: _Commands) -> None:
    run = commands.add_parser(
        "run",
        help="run one solution file on stdin and print the Sandbox Fusion response",
        description="Run SOLUTION (a Python file, or another language's source: see --language) "
        "with this command's standard input as its input, and print the response verl would "
        "receive, as JSON: in a micro-VM of this node (a hyperlight:// URL), or by POSTing "
        "Sandbox Fusion's request to an http(s) URL (a `verl-hyperlight serve`, or a Sandbox "
        "Fusion service: its /run_code URL; with VERL_HYPERLIGHT_TOKEN, if set, as its bearer "
        "token). Exits 0 "
        "when the case ran (whatever the solution did: see the response's status), 1 when it "
        "was answered SandboxError or could not be asked, 2 on a usage error.",
    )
    # Bytes: the solution and its input reach the guest as written (\r\n stays \r\n).
    run.add_argument("solution", type=argparse.FileType("rb"))
    _add_url(run, "sandbox URL: hyperlight://..., or http(s)://.../run_code", positional=False)
    run.add_argument("--timeout", type=float, default=10.0, help="run_timeout in seconds")
    run.add_argument("--memory-limit-mb", type=_memory_limit, default=1024)
    run.add_argument(
        "--language",
        # What runs here first, in RUNS' order (each is one of Sandbox Fusion's), then the rest.
        choices=[*RUNS, *sorted(SANDBOX_FUSION_LANGUAGES.difference(RUNS))],
        metavar="LANGUAGE",
        help=f"the request's language, Sandbox Fusion's name for it: {', '.join(RUNS)} run here; "
        "an http(s) URL's service may run others (default: by SOLUTION's suffix, .cpp .cc .cxx "
        "cpp, .go go, .rs rust, .java java, .js .cjs nodejs, .ts typescript, .sh bash, and the "
        "other languages' usual suffixes, .cs csharp, .rb ruby and so on; else python)",
    )
    run.add_argument(
        "--compile-timeout",
        type=float,
        default=10.0,
        help="compile_timeout in seconds, for cpp, go, rust, java and typescript (default 10)",
    )


# The language `run` gives a solution file by its suffix, when --language does not say:
# Sandbox Fusion's name for the language whose files are so named. One that does not run here
# is answered SandboxError saying which do (not run as Python, to fail as a syntax error); a
# service at an http(s) URL may run it.
SUFFIXES = {
    ".py": "python",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".cxx": "cpp",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".js": "nodejs",
    ".cjs": "nodejs",
    ".ts": "typescript",
    ".sh": "bash",
    ".cs": "csharp",
    ".php": "php",
    ".rb": "ruby",
    ".lua": "lua",
    ".r": "R",
    ".pl": "perl",
    ".d": "D_ut",
    ".scala": "scala",
    ".jl": "julia",
    ".kts": "kotlin_script",
    ".swift": "swift",
    ".rkt": "racket",
    ".lean": "lean",
    ".sql": "sql",
    ".cu": "cuda",
}
# Go's own convention: a file so named holds tests, which `go test` runs (Sandbox Fusion's
# go_test), never `go run`.
GO_TEST_SUFFIX = "_test.go"


def _language_of(name: str) -> tuple[str, str | None]:
    """The language of a solution file named `name`, and what to say of it when its suffix
    names none (it runs as Python)."""
    if name.endswith(GO_TEST_SUFFIX):
        return "go_test", None
    suffix = os.path.splitext(name)[1]
    language = SUFFIXES.get(suffix.lower())
    if language is not None:
        return language, None
    if not suffix:
        return "python", None
    return "python", (
        f"{name}: no language is known by the suffix {suffix!r}: it runs as python "
        f"(--language names another)"
    )


def _add_bench(commands: _Commands) -> None:
    bench = commands.add_parser(
        "bench",
        help="measure how many micro-VMs this node runs well at once, and size max_concurrent",
        description="Run representative cases (trivial; CPU-bound for about 50 ms; 1 MB of "
        "output) at each concurrency level for --seconds each, and print per level cases/s, "
        "p50 and p99 latency and the start-up share (the part of a case's latency outside the "
        "solution); then recommend max_concurrent for --num-workers reward workers: the level "
        "past which cases/s stops rising or p99 degrades, shared among them. Takes about "
        "len(levels) x seconds.",
    )
    _add_url(bench)
    bench.add_argument(
        "--concurrency",
        type=_levels,
        default=None,
        help="comma-separated levels (default 1,2,4,... up to twice the CPUs)",
    )
    bench.add_argument("--seconds", type=float, default=5.0, help="per level (default 5)")
    bench.add_argument(
        "--num-workers", type=_positive_int, default=8, help="verl's reward.num_workers (8)"
    )
    bench.add_argument("--memory-limit-mb", type=_memory_limit, default=1024)
    bench.add_argument(
        "--against",
        metavar="URL",
        help="compare with a Sandbox Fusion service (or another serve) at URL, its /run_code: "
        "the same cases (trivial, CPU-bound for 20 ms, a 100 KB stdin, the quick conformance "
        "programs) through both, alternated in chunks, at concurrency 1 and this node's CPUs "
        "(or --concurrency): cases/s, p50 and p90 and their ratio, and every answer that "
        "disagrees; exits 1 when one does",
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON")


def _add_doctor(commands: _Commands) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check that this node can score code, and say what fixes it if not",
        description="Check this node, one line per check (ok, warn or fail), each warn or fail "
        "with the command or setting that fixes it: platform, hluk, /dev/kvm, hluk's cache, "
        "where case directories go, the guest (its warm snapshot, and a real case end to end, "
        "which leaves the node warm), the pytest extra, how hluk is started (the spawner), the "
        "sizing (with --max-concurrent and --num-workers) and verl's plugin setup. Exits 0 only "
        "when nothing fails.",
    )
    _add_url(doctor)
    doctor.add_argument(
        "--memory-limit-mb",
        type=_memory_limit,
        default=1024,
        help="verl's memory_limit_mb (default 1024)",
    )
    doctor.add_argument(
        "--max-concurrent", type=_positive_int, help="verl's max_concurrent, to check the sizing"
    )
    doctor.add_argument(
        "--num-workers", type=_positive_int, help="verl's reward.num_workers, with --max-concurrent"
    )
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")


def _add_selftest(commands: _Commands) -> None:
    selftest = commands.add_parser(
        "selftest",
        help="check that this node's micro-VMs grade as Sandbox Fusion does (before training)",
        description="Run the conformance corpus through this node's micro-VMs, as the plugin "
        "runs cases, and compare each answer with the one CPython 3.12 gives under Sandbox "
        "Fusion (recorded in the package): one line per family, then every difference with its "
        "program and both answers, marked when it is a documented known limit. Checks hluk and "
        "the warm snapshot first, as doctor does, then a notebook's calls, as the code tool "
        "makes them. Exits 0 only when every difference is a known limit; Ctrl-C stops it at "
        "once, saying what it had checked.",
    )
    _add_url(selftest)
    selftest.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        help="programs at once (default: the CPUs, 4 at least)",
    )
    selftest.add_argument("--json", action="store_true", help="print the whole report as JSON")


def _add_serve(commands: _Commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="answer Sandbox Fusion's HTTP API (POST /run_code) from micro-VMs",
        description="Serve Sandbox Fusion's API (POST /run_code, GET /v1/ping) from this "
        "node's micro-VMs, plus GET /readyz and /metrics. Needs the serve extra "
        f"({diagnosis.install('serve')}). The API has no authentication of its own: it binds the "
        "loopback address unless told otherwise; VERL_HYPERLIGHT_TOKEN, when set, is a bearer "
        "token every /run_code request must carry.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (8080)")
    _add_url(serve, "sandbox URL the cases run with", positional=False)
    # Parsed here, judged by ServeSettings (settings.py), which makes the defaults too.
    serve.add_argument(
        "--max-concurrent",
        type=int,
        help="micro-VMs at once (default: the CPUs this process may use)",
    )
    serve.add_argument(
        "--max-queue",
        type=int,
        help="requests that may wait for a micro-VM (default: 8 x max-concurrent)",
    )
    serve.add_argument(
        "--max-wait",
        type=float,
        help="seconds a request waits for a micro-VM before HTTP 504 (default 5; never more "
        "than its compile_timeout + 5; a free one is always taken, even with 0)",
    )
    serve.add_argument("--max-body-mb", type=int, help="largest request body (64 MiB)")
    serve.add_argument(
        "--max-bodies-mb",
        type=int,
        help="the request bodies held at once, in all (being read, waiting or running); past "
        "it, HTTP 504 at once (default: a sixteenth of this node's memory, at least "
        "--max-body-mb)",
    )
    serve.add_argument(
        "--grace", type=float, help="seconds in-flight cases get to finish on SIGTERM (default 30)"
    )
    serve.add_argument(
        "--memory-limit-mb",
        type=int,
        help="the memory limit whose guest is warmed up at start (verl's default, 1024)",
    )
    serve.add_argument(
        "--max-memory-mb",
        type=int,
        help="largest memory_limit_MB a request may ask for; past it, a SandboxError "
        "(default and most: half this node's memory)",
    )
    serve.add_argument(
        "--max-run-timeout",
        type=float,
        help="largest run_timeout a request may ask for, in seconds; past it, a SandboxError "
        "(default 300)",
    )


def _memory_limit(text: str) -> int:
    """A --memory-limit-mb: verl's memory_limit_mb (judged against the nodes that run the
    cases once the URL is known: `_judge_memory`)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None


def _on_cluster(url: object) -> bool:
    """Whether `url` sends cases to the nodes of a Ray cluster (hyperlight://...?ray)."""
    try:
        return parse_url(url).ray is not None
    except InvalidRequest:
        return False


def _judge_memory(args: argparse.Namespace) -> None:
    """Refuse a --memory-limit-mb past the most a case may ask for on this node, as serve
    refuses it, when the cases run here: a ?ray URL's nodes judge it by their own memory."""
    memory = getattr(args, "memory_limit_mb", None)
    if args.command == "serve" or memory is None or _on_cluster(getattr(args, "url", None)):
        return
    refusal = memory_limit_refusal(memory)
    if refusal is not None:
        args.usage.error(f"argument --memory-limit-mb: {refusal}")


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: levels are positive numbers")
    return levels


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


def _how(warmth: Warmth | None) -> str:
    if warmth is None or warmth.restored is None:
        return ""
    if warmth.restored:
        return f" (its warm snapshot restored in {warmth.seconds * 1000:.0f} ms)"
    return f" (pulled and snapshotted in {warmth.seconds:.1f} s)"


# What a command exits with when the reader of its output went away (`| head`), as a shell
# says a command that SIGPIPE ended.
BROKEN_PIPE_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe prints a traceback
    except BrokenPipeError:
        # `verl-hyperlight run ... | head -c 1`: the reader has what it wanted; end quietly, as a
        # Unix tool does, with nothing more written to the closed pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_STATUS
    return status


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is not None:
        _url_of(args)
    _judge_memory(args)
    if args.command == "serve":
        try:
            args.settings = _serve_settings(args)
        except ValueError as exc:
            args.usage.error(str(exc))
    try:
        guest = _guest(args)
    except InvalidRequest as exc:
        print(f"verl-hyperlight {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "warm-up" and _on_cluster(args.url):
        return _warm_up_the_cluster(args.url, args.memory_limit_mb, args.language)
    if args.command == "warm-up":
        assert guest is not None
        try:
            with progress(f"seeing {guest.image.label} warm (a pull and a boot if needed)"):
                warmth = warm_up(args.url, args.memory_limit_mb, args.language)
            print(f"{guest.image.label} is warm on this node{_how(warmth)}", flush=True)
            with progress("seeing Go's build cache warm, where Go is installed"):
                compiles = compiled.warm()
        except BackendError as exc:
            print(f"verl-hyperlight: {exc}", file=sys.stderr)
            return 1
        if compiles is not None:
            print(compiles)
        return 0
    if args.command == "run":
        try:
            code = _text(args.solution.read(), args.solution.name)
            if sys.stdin.isatty():
                print(
                    "verl-hyperlight: reading the solution's input from the terminal: type it, "
                    "then Ctrl-D (or give it a file: < input.txt)",
                    file=sys.stderr,
                    flush=True,
                )
            stdin = _text(sys.stdin.buffer.read(), "standard input")
        except ValueError as exc:
            print(f"verl-hyperlight: {exc}", file=sys.stderr)
            return 1
        if args.timeout <= 0:
            print(
                f"verl-hyperlight: --timeout {args.timeout:g} is answered TimeLimitExceeded at "
                "once, as Sandbox Fusion answers a run_timeout of 0 or less",
                file=sys.stderr,
            )
        language = args.language
        if language is None:
            language, note = _language_of(args.solution.name)
            if note is not None:
                print(f"verl-hyperlight: {note}", file=sys.stderr)
        if is_http(args.url):
            from .commands import remote

            response, error = remote.post(
                args.url,
                code,
                stdin,
                args.timeout,
                args.memory_limit_mb,
                language,
                args.compile_timeout,
            )
        else:
            response, error = run_code(
                args.url,
                code,
                stdin,
                args.compile_timeout,
                args.timeout,
                args.memory_limit_mb,
                language,
            )
        if error is not None:
            print(f"verl-hyperlight: {error}", file=sys.stderr)
            return 1
        print(json.dumps(response, indent=2))
        return 0 if response and response["status"] != "SandboxError" else 1
    if args.command == "serve":
        return _serve(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "selftest":
        return _selftest(args)
    parser.print_help()
    return 0


def _warm_up_the_cluster(url: str, memory_limit_mb: int, language: str) -> int:
    """warm-up of a ?ray URL: each alive node that offers its resource warms its guest (a task
    pinned there, all at once), each said as it comes; 1 when a node could not."""
    parsed = parse_url(url)
    assert parsed.ray is not None
    try:
        nodes = cluster.nodes_offering(parsed.ray)
    except BackendError as exc:
        print(f"verl-hyperlight: {exc}", file=sys.stderr)
        return 1
    if not nodes:
        print(f"verl-hyperlight: {diagnosis.ray_nodes_to_warm(parsed.ray)}", file=sys.stderr)
        return 1
    limit = settings.WARM_UP_TIMEOUT.value() + settings.STARTUP_TIMEOUT.value() + 30
    failed = 0
    with progress(f"warming up {len(nodes)} node(s) that offer {parsed.ray!r}"):
        found = cluster.run_on_each(
            parsed.ray, nodes, _warm_up_here, (parsed.local, memory_limit_mb, language), limit
        )
        for node, said in found:
            if isinstance(said, tuple) and said[0]:
                print(f"[{node.label}] {said[1]}", flush=True)
            else:
                failed += 1
                why = said[1] if isinstance(said, tuple) else repr(said)
                print(f"[{node.label}] verl-hyperlight: {why}", file=sys.stderr, flush=True)
    return 1 if failed else 0


def _warm_up_here(url: str, memory_limit_mb: int, language: str) -> tuple[bool, str]:
    """On a node of the cluster: its guest of `url` (and `language`) seen warm (True), said as
    warm-up says it; or why it cannot be (False)."""
    guest = guest_for(url, memory_limit_mb, language)
    try:
        warmth = warm_up(url, memory_limit_mb, language)
        compiles = compiled.warm()
    except BackendError as exc:
        return False, str(exc)
    said = f"{guest.image.label} is warm on this node{_how(warmth)}"
    return True, said if compiles is None else f"{said}; {compiles}"


def _guest(args: argparse.Namespace) -> Guest | None:
    """The guest a command that runs cases here asks for with its sandbox URL and memory limit
    (None for the others, and for run with an http(s) URL: the remote's to judge). Raises
    InvalidRequest for a setting no case could run with, a usage error (exit 2) for them all,
    so that a server does not start and answer 503 for ever; doctor reports it as its guest
    check instead."""
    if args.command not in ("serve", "warm-up", "run", "selftest"):
        return None
    if args.command == "run" and is_http(args.url):
        return None
    if args.command == "selftest":
        from .commands import selftest

        return guest_for(args.url, selftest.MEMORY_LIMIT_MB)
    if args.command == "serve":
        return guest_for(args.url, args.settings.warm_up_memory_mb)
    return guest_for(args.url, args.memory_limit_mb, getattr(args, "language", None) or "python")


def _serve_settings(args: argparse.Namespace) -> ServeSettings:
    """serve's settings: those its command line gives, the rest ServeSettings' defaults;
    ValueError naming the option it cannot honour."""
    mib = 1024 * 1024
    given = {
        "max_concurrent": args.max_concurrent,
        "max_queue": args.max_queue,
        "max_wait": args.max_wait,
        "max_body_bytes": None if args.max_body_mb is None else args.max_body_mb * mib,
        "max_bodies_bytes": None if args.max_bodies_mb is None else args.max_bodies_mb * mib,
        "grace": args.grace,
        "warm_up_memory_mb": args.memory_limit_mb,
        "max_memory_mb": args.max_memory_mb,
        "max_run_timeout": args.max_run_timeout,
    }
    # Options left out keep their defaults; max_queue, max_bodies_bytes and max_memory_mb
    # default to None, which ServeSettings sizes from the rest.
    return ServeSettings(
        url=args.url,
        token=TOKEN.value(),
        cluster=_on_cluster(args.url),
        **{name: value for name, value in given.items() if value is not None},
    )


def _bench(args: argparse.Namespace) -> int:
    from .commands import bench

    if args.seconds <= 0:
        print("verl-hyperlight: --seconds must be positive", file=sys.stderr)
        return 2
    cpus = node.cpus()
    levels = args.concurrency or [2**i for i in range(8) if 2**i <= 2 * cpus]
    if args.against is not None and not is_http(args.against):
        print(
            f"verl-hyperlight: --against {args.against}: an http(s) URL, its /run_code",
            file=sys.stderr,
        )
        return 2
    try:
        with progress(f"warming up {args.url}", None):
            bench.check(args.url, args.memory_limit_mb)
    except (InvalidRequest, BackendError) as exc:
        print(f"verl-hyperlight: {exc}", file=sys.stderr)
        return 1
    if args.against is not None:
        return _bench_against(args, args.concurrency or sorted({1, cpus}))
    measured = []
    for level in levels:
        with progress(f"concurrency {level}", args.seconds) as tick:
            measured.append(
                bench.measure(args.url, args.memory_limit_mb, level, args.seconds, tick)
            )
    advice = bench.recommend(measured, args.num_workers)
    if args.json:
        print(json.dumps(bench.as_json(cpus, measured, advice), indent=2))
    else:
        print(bench.render(cpus, args.seconds, measured, advice, args.num_workers))
    return 0


def _bench_against(args: argparse.Namespace, levels: list[int]) -> int:
    from .commands import against

    with progress(f"comparing with {args.against}", None) as tick:
        found = against.compare(
            args.url, args.against, args.memory_limit_mb, levels, args.seconds, tick
        )
    if args.json:
        print(json.dumps(against.as_json(found), indent=2))
    else:
        print(against.render(found))
    return 1 if found.disagreements else 0


def _doctor(args: argparse.Namespace) -> int:
    from .commands import doctor

    options = doctor.Options(
        url=args.url,
        memory_limit_mb=args.memory_limit_mb,
        max_concurrent=args.max_concurrent,
        num_workers=args.num_workers,
    )
    found = []
    for check in doctor.checks(options):
        found.append(check)
        if not args.json:
            print(doctor.render([check]), flush=True)
    if args.json:
        print(json.dumps(doctor.as_json(found), indent=2))
    return 0 if all(check.status != "fail" for check in found) else 1


def _selftest(args: argparse.Namespace) -> int:
    from .commands import doctor, selftest

    def show(check: doctor.Check) -> None:
        if not args.json:
            print(doctor.render([check]), flush=True)

    jobs = args.jobs or selftest.default_jobs()
    with progress(f"running the conformance corpus, {jobs} at once"):
        report = selftest.selftest(args.url, jobs, on_check=show)
    if args.json:
        print(json.dumps(selftest.as_json(report), indent=2, ensure_ascii=False))
    else:
        print(selftest.render(report))
    if report.interrupted:
        return 130  # as a shell says a command that SIGINT ended
    return 0 if report.ok else 1


def _serve(args: argparse.Namespace) -> int:
    try:
        from .server import app
    except ImportError as exc:
        print(
            f"verl-hyperlight: serve needs its extra ({exc.name} is missing): "
            f"{diagnosis.install('serve')}",
            file=sys.stderr,
        )
        return 1
    raise_descriptor_limit()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app.serve(args.settings, args.host, args.port)
    return 0
