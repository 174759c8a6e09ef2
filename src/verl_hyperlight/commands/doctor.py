"""`verl-hyperlight doctor`: whether this node can score code, and what fixes it if not.

Each check is a line: ok, warn or fail, what was found, and for every warn or fail the
command or setting that fixes it. The guest checks run a real case end to end, so a doctor run
also leaves the node warm.
"""

from __future__ import annotations

import getpass
import grp
import importlib.metadata
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Generator, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .. import diagnosis, node, settings
from ..case import casedir, cluster, compiled, gate, pytest_library
from ..case.api import answer
from ..case.guests import LANGUAGE_IMAGES, guest_for
from ..case.ready import most_kept
from ..case.url import parse_url
from ..errors import BackendError, Diagnosis, InvalidRequest, Refused
from ..hluk import spawn
from ..hluk.binary import check_version, hluk_path
from . import bench

KVM_DEVICE = "/dev/kvm"
# A warm snapshot is about 75 MiB (python) to several hundred (agent); images as much again.
MIN_FREE_BYTES = 2 * 1024**3
ARCHITECTURES = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "arm64", "arm64": "arm64"}
PLUGIN_MODULE = "verl_hyperlight.plugin"
ENTRY_POINT = "hyperlight"
# The name column's width: the longest name a check has (lines are printed as checks end, so
# one width for all keeps them aligned).
NAME_WIDTH = max(
    8,
    *(len(f"{language} compiler") for language in compiled.BUILT),
    *(len(f"{language} image") for language in LANGUAGE_IMAGES),
)


@dataclass(frozen=True)
class Check:
    """One finding."""

    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, "warn", detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, "fail", detail, fix)


def failed(name: str, found: Diagnosis, prefix: str = "") -> Check:
    """A failed check of what `found` diagnoses: what it found, and its fix (or, where it has
    none, where to look)."""
    detail = f"{prefix}{found.what}" + (f"; {found.after}" if found.after else "")
    return fail(name, detail, found.fix or diagnosis.SEE_WARM_UP)


@dataclass(frozen=True)
class Options:
    url: str = "hyperlight://"
    memory_limit_mb: int | None = 1024
    max_concurrent: int | None = None
    num_workers: int | None = None


# The line the test suite's stand-in for hluk carries (tests/standin/hluk).
STANDIN_MARK = b"# verl-hyperlight: the test stand-in for hluk"


def checks(options: Options) -> Iterator[Check]:
    """Every check, in the order an operator fixes them."""
    yield from _platform()
    yield _settings()
    resource = _ray_resource(options.url)
    if resource is not None:
        yield from cluster_checks(options, resource)
        yield from _verl()
        return
    path = yield from hluk_checks()
    yield _kvm()
    yield from _cache()
    yield _case_directories()
    if path is not None:
        yield from guest_checks(path, options)
    yield _pytest()
    yield from _compilers()
    yield from _language_images()
    yield _spawn_check()
    yield from _sizing(options)
    yield from _verl()


def _ray_resource(url: str) -> str | None:
    try:
        return parse_url(url).ray
    except InvalidRequest:
        return None  # the guest check says what is wrong with it


def cluster_checks(options: Options, resource: str) -> Iterator[Check]:
    """hyperlight://?ray: the cluster reached, the alive nodes that offer `resource`, and on
    each of them (a task pinned there) the checks of hluk, /dev/kvm, the warm guest and a case
    end to end, as doctor makes them on a node of its own."""
    try:
        offering = cluster.nodes_offering(resource)
    except BackendError as exc:
        yield failed("ray", exc.diagnosis)
        return
    if not offering:
        problem = diagnosis.ray_resource_offered_by_none(resource, 0).diagnosis
        yield fail("nodes", f"no alive node of the Ray cluster offers {resource!r}", problem.fix)
        return
    yield ok(
        "nodes",
        f"{len(offering)} alive node(s) offer {resource!r}: "
        + ", ".join(
            f"{member.address} ({member.node_id[:8]}, {member.units:g})" for member in offering
        ),
    )
    local = replace(options, url=parse_url(options.url).local)
    limit = settings.WARM_UP_TIMEOUT.value() + settings.STARTUP_TIMEOUT.value() + 30
    for member, found in cluster.run_on_each(resource, offering, _node_checks, (local,), limit):
        place = f"[{member.label}]"
        if isinstance(found, Exception):
            yield fail("node", f"{place} its checks did not come back: {found!r}", "ray status")
            continue
        for check in found:
            yield replace(check, detail=f"{place} {check.detail}")


def _node_checks(options: Options) -> list[Check]:
    """On a node of the cluster: the checks doctor makes of a node's own micro-VMs."""

    def found() -> Iterator[Check]:
        path = yield from hluk_checks()
        yield _kvm()
        if path is not None:
            yield from guest_checks(path, options)

    return list(found())


def _platform() -> Iterator[Check]:
    system, machine = platform.system(), platform.machine()
    if system != "Linux" or machine.lower() not in ARCHITECTURES:
        yield fail(
            "platform",
            f"{system} {machine}: hluk runs on Linux, x86-64 or arm64",
            "run the reward workers (or `verl-hyperlight serve`) on such a node",
        )
    else:
        yield ok("platform", f"Linux {ARCHITECTURES[machine.lower()]}")
    # The package installs on 3.10 and later only: being here says enough.
    version = ".".join(map(str, sys.version_info[:3]))
    yield ok("python", f"Python {version} ({sys.executable})")


def _settings() -> Check:
    """Variables named as ours that no setting reads: ignored, so a misspelling would pass
    unseen (a deadline never raised, a directory never used)."""
    unknown = settings.unknown_settings()
    if not unknown:
        return ok("settings", f"no {settings.OURS}* variable set here is unknown")
    detail = ", ".join(
        name if near is None else f"{name} (did you mean {near}?)" for name, near in unknown.items()
    )
    fixes = [f"rename {name} to {near}" for name, near in unknown.items() if near is not None]
    fixes += [f"unset {name}" for name, near in unknown.items() if near is None]
    return warn(
        "settings",
        f"set but no setting of verl-hyperlight, so ignored: {detail}",
        "; ".join(fixes) + " (every setting: docs/reference/settings.md)",
    )


def hluk_checks() -> Generator[Check, None, str | None]:
    """hluk: found, executable, exec'd by its wrapper, recent enough. Returns its path, if it
    can run."""
    try:
        path = hluk_path()
    except BackendError as exc:
        if exc.diagnosis.cause == diagnosis.HLUK_OFF_PATH:  # installed, its folder not on PATH
            yield failed("hluk", exc.diagnosis)
        else:
            yield fail(
                "hluk",
                "not found on PATH, and HLUK_PATH is not set",
                diagnosis.INSTALL_COMMAND + diagnosis.try_without_kvm(),
            )
        return None
    problem = diagnosis.hluk_file_problem(path)
    if problem is not None:
        yield failed("hluk", problem)
        return None
    head = _head(path)
    if STANDIN_MARK in head:
        yield warn(
            "stand-in",
            f"{path} is the test stand-in: weaker isolation, for trying only",
            f"to train, install hluk on a node with KVM ({diagnosis.INSTALL_COMMAND}) and "
            "unset HLUK_PATH",
        )
    elif _wrapper_without_exec(head):
        yield warn(
            "wrapper",
            f"{path} is a script that does not exec hluk: a reward worker that dies would "
            "leave its micro-VMs running",
            'end the script with: exec /path/to/hluk "$@"',
        )
    try:
        version = check_version(path)
    except BackendError as exc:
        found = exc.diagnosis
        yield fail(
            "hluk", found.what, found.fix or f"{diagnosis.INSTALL_COMMAND} (0.19.0 or later)"
        )
        return None
    yield ok("hluk", f"hluk {version} at {path}")
    return path


def _head(path: str) -> bytes:
    """The first 64 KiB of the file at `path` (b"" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(64 * 1024)
    except OSError:
        return b""


def _wrapper_without_exec(head: bytes) -> bool:
    """Whether a file that begins with `head` is a script with no exec line."""
    if not head.startswith(b"#!"):
        return False
    lines = head.decode(errors="replace").splitlines()[1:]
    return not any(re.match(r"\s*exec\s", line) for line in lines)


def _can_use(path: str) -> bool:
    return os.access(path, os.R_OK | os.W_OK)


def _kvm() -> Check:
    if not os.path.exists(KVM_DEVICE):
        return fail(
            "/dev/kvm",
            f"{KVM_DEVICE} does not exist: this node has no KVM (a VM without nested "
            "virtualization, or a container without the device)",
            "run on a node with KVM, or send the cases to nodes that have it: "
            "hyperlight://?ray (the Ray cluster's KVM nodes) or a `verl-hyperlight serve` there"
            + diagnosis.try_without_kvm(),
        )
    if not _can_use(KVM_DEVICE):
        group = grp.getgrgid(os.stat(KVM_DEVICE).st_gid).gr_name
        user = getpass.getuser()
        return fail(
            "/dev/kvm",
            f"{KVM_DEVICE} is not readable and writable by {user} (it belongs to group {group})",
            diagnosis.join_kvm_group(group, user),
        )
    return ok("/dev/kvm", f"{KVM_DEVICE} is readable and writable")


def _cache() -> Iterator[Check]:
    root = Path(settings.hluk_cache_directory())
    fix = diagnosis.CACHE_FIX
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root):
            pass
    except OSError as exc:
        yield fail("cache", f"hluk's cache {root} is not writable ({exc})", fix)
        return
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        yield warn(
            "cache",
            f"hluk's cache {root} has {free / 1024**3:.1f} GiB free; images and warm "
            f"snapshots need {MIN_FREE_BYTES / 1024**3:.0f} GiB or more",
            f"free space there, or {fix}",
        )
    else:
        yield ok("cache", f"hluk's cache {root}, {free / 1024**3:.1f} GiB free")


def _case_directories() -> Check:
    """Where case directories go: one made as a case makes it, and removed."""
    try:
        made = casedir.make([])
    except BackendError as exc:
        return failed("case-dir", exc.diagnosis)
    made.remove()
    chosen = settings.CASE_DIR.value()
    if chosen:
        return ok("case-dir", f"case directories go to {made.parent} ({settings.CASE_DIR.name})")
    if made.parent == casedir.TMPFS:
        return ok(
            "case-dir",
            f"case directories go to the tmpfs {casedir.TMPFS} (while it is at least half free; "
            "else to TMPDIR)",
        )
    return warn(
        "case-dir",
        f"case directories go to {made.parent} (TMPDIR), not to the tmpfs {casedir.TMPFS}, "
        "where making and removing them costs a fraction",
        diagnosis.off_tmpfs_fix(made.parent),
    )


def _pytest() -> Check:
    """Whether `language: "pytest"` cases can run: the pytest extra, copied for the guest."""
    try:
        library = pytest_library.library()
    except pytest_library.Missing as exc:
        return warn("pytest", exc.diagnosis.what, exc.diagnosis.fix)
    except BackendError as exc:
        return failed("pytest", exc.diagnosis)
    version = importlib.metadata.version("pytest")
    return ok(
        "pytest",
        f"the pytest extra is installed: pytest {version} for language 'pytest' cases, "
        f"given to the guest from {library}",
    )


def _compilers() -> Iterator[Check]:
    """Whether `cpp`, `go`, `rust` and `java` cases can compile here, and `typescript` ones
    transpile: each one's toolchain, and the bubblewrap they compile in. A node without one
    still runs every other language."""
    for language in compiled.BUILT:
        try:
            found = compiled.check(language)
        except BackendError as exc:
            yield warn(f"{language} compiler", exc.diagnosis.what, exc.diagnosis.fix)
        else:
            verb = "transpile" if language in compiled.TRANSPILED else "compile"
            yield ok(f"{language} compiler", f"{language} cases {verb} with {found}")


def _language_images() -> Iterator[Check]:
    """The image each language with one of its own runs in (`nodejs`: hluk's node image):
    pulled into hluk's cache already, or on its first case, with the command that takes it
    ahead. Not started here: a node that never runs the language needs nothing of it."""
    rootfs = Path(settings.hluk_cache_directory()) / "rootfs"
    said = set()
    for language, image in LANGUAGE_IMAGES.items():
        if image in said:
            continue  # one line per image, named by the first language that runs in it
        said.add(image)
        name = image.args[-1]
        pulled = [path for path in rootfs.rglob("*.cpio") if path.parent.name == name]
        command = f"verl-hyperlight warm-up --language {language}"
        if pulled:
            yield ok(
                f"{language} image",
                f"{language} cases run in {image.label} ({image.default_memory_mb} MiB by "
                f"default), in hluk's cache at {pulled[0]}",
            )
        else:
            # Not a fault: a node that runs no such case needs nothing of it.
            yield ok(
                f"{language} image",
                f"{language} cases run in {image.label}, not pulled yet: the first {language} "
                f"case would wait for its pull and warm snapshot ({command} takes them ahead)",
            )


def guest_checks(path: str, options: Options) -> Iterator[Check]:
    """The guest of `options` with the hluk at `path`: that it starts, its warm snapshot (taken
    if missing), then a case end to end, twice (a first case's latency and the next's)."""
    try:
        guest = guest_for(options.url, options.memory_limit_mb)
    except InvalidRequest as exc:
        yield fail("guest", str(exc), "check the URL and --memory-limit-mb")
        return
    images = list((Path(settings.hluk_cache_directory()) / "rootfs").rglob("*.cpio"))
    try:
        warmth = gate.ensure_ready(path, guest)
    except BackendError as exc:
        yield failed("guest", exc.diagnosis, f"{guest.image.label} cannot start: ")
        return
    if warmth is not None and warmth.restored is False:
        yield warn(
            "snapshot",
            f"{guest.image.label} had no warm snapshot{'' if images else ' (nor an image)'}: "
            f"doctor just took it ({warmth.seconds:.1f} s, which a first case would wait)",
            f"verl-hyperlight warm-up {options.url} on every node before training",
        )
    else:
        yield ok("snapshot", f"{guest.image.label} is warm")
    latencies = []
    for _ in range(2):
        started = time.monotonic()
        try:
            response = answer(options.url, "print(1+1)", "", 10, options.memory_limit_mb)
        except BackendError as exc:
            yield failed("case", exc.diagnosis, "print(1+1) did not succeed: ")
            return
        except (InvalidRequest, Refused) as exc:
            yield fail("case", f"print(1+1) did not succeed: {exc}", diagnosis.SEE_WARM_UP)
            return
        latencies.append(time.monotonic() - started)
        if response["status"] != "Success":
            said = response.get("message") or str(response)
            yield fail("case", f"print(1+1) did not succeed: {said}", diagnosis.SEE_WARM_UP)
            return
    yield ok(
        "case",
        f"print(1+1) answered 2: {latencies[0] * 1000:.0f} ms the first time, "
        f"{latencies[1] * 1000:.0f} ms the next",
    )


def _spawn_check() -> Check:
    cheap, how = spawn.describe()
    if cheap:
        return ok("spawn", how)
    return warn(
        "spawn",
        how,
        f"check that {sys.executable} runs `-I -S`, and unset {settings.SPAWN.name}; else install "
        "util-linux 2.33 or later (setpriv --pdeathsig), e.g. apt install util-linux",
    )


def _sizing(options: Options) -> Iterator[Check]:
    if options.max_concurrent is None or options.num_workers is None:
        return
    cpus = node.cpus()
    vms = options.max_concurrent * options.num_workers
    if vms > cpus:
        yield fail(
            "sizing",
            f"max_concurrent {options.max_concurrent} x {options.num_workers} reward workers "
            f"= {vms} micro-VMs on {cpus} CPUs: cases slow down and pass their timeouts",
            _fitting(cpus, options.num_workers),
        )
    else:
        yield ok("sizing", f"{vms} micro-VMs at most on {cpus} CPUs")
    try:
        guest = guest_for(options.url, options.memory_limit_mb)
    except InvalidRequest:
        return
    # Micro-VMs started ahead of their cases (case/ready.py), per worker: memory, no CPU.
    ready = options.num_workers * most_kept(options.max_concurrent)
    need = vms * (guest.memory_mb + node.HOST_MB_PER_CASE) + ready * guest.memory_mb
    free = node.available_mb()
    counted = (
        f"{vms} micro-VMs of {guest.memory_mb} MiB (and up to {node.HOST_MB_PER_CASE} MiB each "
    )
    counted += f"on the host) and {ready} ready ones" if ready else "on the host)"
    if free is not None and need > free:
        per_vm = guest.memory_mb + node.HOST_MB_PER_CASE
        if free // per_vm:
            fix = f"{_fitting(free // per_vm, options.num_workers)}, or a lower memory_limit_mb"
        else:
            fix = "a lower memory_limit_mb: not one such micro-VM fits"
        if ready:
            fix = f"{settings.READY_GUESTS.name}=0 (or 1), {fix}"
        yield fail("memory", f"{counted} need {need} MiB; {free} MiB is available", fix)
    elif free is not None:
        yield ok("memory", f"{need} MiB at most of {free} MiB available ({counted})")


def _fitting(capacity: int, num_workers: int) -> str:
    """The settings that run `capacity` micro-VMs at once on `num_workers` workers (bench's rule:
    fewer workers when there are more than that)."""
    per_worker, workers = bench.share(capacity, num_workers)
    if workers == num_workers:
        return f"max_concurrent={per_worker}"
    return f"max_concurrent=1, reward.num_workers={workers}"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _verl_version() -> str | None:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def _plugins() -> set[str]:
    """The names of the verl.plugins entry points installed here."""
    return {ep.name for ep in importlib.metadata.entry_points(group="verl.plugins")}


def _verl() -> Iterator[Check]:
    version = _verl_version()
    if version is None:
        yield warn(
            "verl",
            "verl is not installed in this environment",
            "install verl-hyperlight in the environment verl's reward workers use",
        )
        return
    release = _version(version)
    key = "reward" if release >= (0, 7, 1) else "reward_model"
    names = _plugins()
    if release < (0, 6):
        yield warn(
            "verl",
            f"verl {version} has no plugin hook",
            "run `verl-hyperlight serve --host 0.0.0.0` on a node with KVM and point "
            f"{key}.sandbox_fusion.url at it: http, port 8080, path /run_code",
        )
        return
    if ENTRY_POINT not in names:
        yield fail(
            "verl",
            f"verl {version}; the {ENTRY_POINT} entry point of verl.plugins is missing",
            diagnosis.install(again=True),
        )
        return
    if release < (0, 9):
        modules = settings.VERL_MODULES.value() or ""
        if PLUGIN_MODULE not in [m.strip() for m in modules.split(",")]:
            yield fail(
                "verl",
                f"verl {version} loads plugins only through VERL_USE_EXTERNAL_MODULES, which "
                f"does not name {PLUGIN_MODULE}",
                f"VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE} in every process (Ray's runtime_env)",
            )
            return
    else:
        policy = settings.VERL_PLUGINS.value()
        allowed = policy is None or policy.strip().lower() == "auto"
        if not allowed and policy is not None and policy.strip().lower() != "none":
            allowed = ENTRY_POINT in [p.strip().lower() for p in policy.split(",")]
        if not allowed:
            yield fail(
                "verl",
                f"verl {version}, but VERL_USE_EXTERNAL_PLUGINS={policy!r} keeps the plugin out",
                "unset VERL_USE_EXTERNAL_PLUGINS, or name hyperlight in it",
            )
            return
    yield ok("verl", f"verl {version} loads the plugin; set {key}.sandbox_fusion.url=hyperlight://")


def render(found: list[Check]) -> str:
    width = max(NAME_WIDTH, *(len(check.name) for check in found))
    lines = []
    for check in found:
        lines.append(f"{check.status:<5} {check.name:<{width}}  {check.detail}")
        if check.fix:
            lines.append(f"{'':<5} {'':<{width}}  fix: {check.fix}")
    return "\n".join(lines)


def as_json(found: list[Check]) -> dict[str, object]:
    return {
        "ok": all(check.status != "fail" for check in found),
        "checks": [asdict(check) for check in found],
    }
