"""The README (the front door) and the docs site (mkdocs.yml, docs/): what they show runs, every
page is reachable, and the settings reference is the settings module's. CI builds the site with
`mkdocs build --strict` (.ci/run)."""

from __future__ import annotations

import functools
import http.server
import importlib.metadata
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from serving import free_port

from verl_hyperlight import diagnosis, settings
from verl_hyperlight.agent.calls import ToolSettings
from verl_hyperlight.case.url import DEFAULT_RESOURCE, is_ours

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of a Markdown text."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def nav_pages(entries: object) -> list[str]:
    """The pages mkdocs.yml's nav names, in order."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for heading in ("## Quick start", "## Run a case from Python", "## Serve Sandbox Fusion's API"):
        assert heading in text
    assert "git clone" in text and "torch==2.13.0 verl==0.9.1" in text
    # Every page it links to exists.
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_the_readmes_run_code_says_what_to_fix_on_a_node_without_hluk(tmp_path: Path) -> None:
    """A newcomer ran the README's snippet before installing hluk: the answer is a
    SandboxError with no run_result, and the snippet said `TypeError: 'NoneType' object is not
    subscriptable`. It says what the answer says instead."""
    [snippet] = [
        block.body
        for block, _, _ in blocks(README)
        if block.language == "python" and "run_code(" in block.body
    ]
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("HLUK_", "VERL_HYPERLIGHT_"))
    }
    environment["HLUK_PATH"] = str(tmp_path / "not-installed" / "hluk")
    done = subprocess.run(
        [sys.executable, "-c", snippet],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "hluk was not found at" in done.stderr and "install" in done.stderr


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk
    assert len(pages) == len(set(pages))


def test_the_settings_reference_is_the_settings_modules_own() -> None:
    page = (DOCS / "reference" / "settings.md").read_text()
    assert page == settings.reference(), "python -m verl_hyperlight.settings > " + str(
        DOCS / "reference" / "settings.md"
    )
    for setting in settings.ALL:
        assert f"| `{setting.name}` |" in page


# Every code example of the README and the docs runs here, against the stand-in hluk, so none
# goes stale. A ```bash block runs under bash, line for line as a reader would type it, but for
# the lines that cannot run in a test (each has its rule below, which checks what the line says
# instead); a ```python block runs and, with a ```text block right after it, prints exactly
# that; a ```yaml block is loaded as its reader's program would load it. A ```json or ```text
# block right after an example is what that example prints. docs/index.md is the README's own
# (test_the_home_page_is_the_readme), so its examples run once, as the README's.
RUNNABLE = ("bash", "python", "yaml")
OUTPUTS = ("json", "text")
EXAMPLE_TIMEOUT = 600  # seconds: selftest runs its whole corpus


@dataclass(frozen=True)
class Block:
    page: str  # relative to the checkout
    line: int  # of its opening fence
    language: str
    body: str


@dataclass(frozen=True)
class Example:
    block: Block
    output: Block | None  # what it prints, shown right after it

    @property
    def needs_verl(self) -> bool:
        return "examples/score_codecontests.py" in self.block.body


def blocks(page: Path) -> list[tuple[Block, int, int]]:
    """The fenced blocks of a page, each with where it starts and ends in the text."""
    text = page.read_text()
    return [
        (
            Block(str(page.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m[1], m[2]),
            m.start(),
            m.end(),
        )
        for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    ]


def example_pages() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md") if p != DOCS / "index.md")]


def examples() -> list[Example]:
    found = []
    for page in example_pages():
        text, fenced_blocks = page.read_text(), blocks(page)
        for i, (block, _, end) in enumerate(fenced_blocks):
            if block.language not in RUNNABLE:
                continue
            output = None
            if i + 1 < len(fenced_blocks):
                after, start, _ = fenced_blocks[i + 1]
                if after.language in OUTPUTS and not text[end:start].strip():
                    output = after
            found.append(Example(block, output))
    return found


EXAMPLES = examples()


def test_every_block_is_an_example_or_shows_what_one_prints() -> None:
    outputs = {example.output for example in EXAMPLES}
    for page in example_pages():
        for block, _, _ in blocks(page):
            where = f"{block.page}:{block.line}"
            assert block.language in RUNNABLE + OUTPUTS, f"{where}: ```{block.language}"
            if block.language in OUTPUTS:
                assert block in outputs, f"{where}: shows the output of no example before it"
    assert len(EXAMPLES) >= 10


def test_no_page_has_an_indented_code_block() -> None:
    """An indented block would be an example that nothing runs: every one is fenced."""
    markdown = pytest.importorskip("markdown", reason="the docs extra renders the pages")
    for page in [README, *DOCS.rglob("*.md")]:
        html = markdown.markdown(page.read_text(), extensions=["fenced_code", "tables"])
        assert "<pre><code>" not in html, f"{page}: an indented code block"


def test_the_home_page_is_the_readme() -> None:
    """docs/index.md is the README with its links made the site's own."""
    readme = README.read_text().replace("](docs/", "](")
    readme = readme.replace(
        "The docs (`pip install -e '.[docs]' && mkdocs serve`, or read `docs/` here):",
        "The pages of this site:",
    )
    assert (DOCS / "index.md").read_text() == readme


def example_id(example: Example) -> str:
    return f"{example.block.page}:{example.block.line}"


@pytest.mark.parametrize("example", [e for e in EXAMPLES if not e.needs_verl], ids=example_id)
def test_each_example_runs(
    example: Example, standin_env: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_example(example, standin_env, tmp_path, caplog)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.needs_verl], ids=example_id)
def test_each_example_that_needs_verl_runs(
    example: Example, standin_env: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """CI's verl leg runs these."""
    pytest.importorskip("verl", reason="needs verl (CI's verl leg runs it)")
    run_example(example, standin_env, tmp_path, caplog)


def run_example(
    example: Example,
    standin_env: dict[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    block = example.block
    if block.language == "yaml":
        assert example.output is None
        check_yaml(block, caplog)
        return
    environment = example_environment(block, standin_env)
    if block.language == "python":
        command = [sys.executable, "-c", block.body]
    else:
        command = ["bash", "-c", shell_script(block, tmp_path)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
        cwd=ROOT,
        env=environment,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    if example.output is None:
        return
    if example.output.language == "json":
        answer, shown = json.loads(done.stdout), json.loads(example.output.body)
        for response in (answer, shown):
            response["run_result"].pop("execution_time")
        assert answer == shown
    else:
        assert done.stdout == example.output.body


def example_environment(block: Block, standin_env: dict[str, str]) -> dict[str, str]:
    """This process's environment with the stand-in as an installed hluk: on PATH's place
    (HLUK_PATH), and its bubblewrap passed through. A block that points at the stand-in itself
    (Try it without KVM) gets only its cache, so it is seen doing so."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("HLUK_", "VERL_HYPERLIGHT_"))
    }
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    environment["HLUK_CACHE_DIR"] = standin_env["HLUK_CACHE_DIR"]
    if "HLUK_PATH=" not in block.body and "try-without-kvm.sh" not in block.body:
        environment.update(standin_env)
        environment["VERL_HYPERLIGHT_HLUK_ENV"] = "HLUK_STANDIN_*"
    return environment


# The lines a test cannot run, each checked for what it says instead, replaced by `:`.
CLONE = re.compile(r"git clone <this repository's URL> (\S+) && cd (\S+)")
PIP = re.compile(r"pip install -e (\.|'\.\[([\w,]+)\]')((?: \S+==\S+)*)( && pytest)?")
VERL_RUN = re.compile(r"python -m verl\.trainer\.main_ppo \.\.\.((?: \S+=\S+)+)")
RAY_JOIN = re.compile(r"ray start --address=HEAD:6379 --resources=('.*')")
SERVE = re.compile(r"verl-hyperlight serve (.*?)( &)?")


def shell_script(block: Block, tmp_path: Path) -> str:
    """The block as bash runs it here: `set -e`, its port a free one, its lines run but for
    those that cannot run in a test, each of which is checked and left out."""
    port = str(free_port())
    script = [
        "set -eo pipefail",
        # What the block leaves running in the background ends with it.
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT",
        'ready() { for _ in $(seq 1200); do curl -sf "localhost:$1/readyz" >/dev/null && '
        'return 0; sleep 0.1; done; echo "serve on $1 never got ready" >&2; return 1; }',
    ]
    for line in logical_lines(block.body):
        command = re.sub(r"\s+# .*$", "", line).replace("8080", port)
        script.append(shell_line(command, tmp_path, port))
    return "\n".join(script)


def logical_lines(body: str) -> list[str]:
    """A block's commands: lines ending in a backslash joined with the next."""
    return [line for line in re.sub(r"\s*\\\n\s*", " ", body).splitlines() if line.strip()]


def shell_line(command: str, tmp_path: Path, port: str) -> str:
    if m := CLONE.fullmatch(command):
        assert m[1] == m[2], command
        return f"cd {tmp_path} && git clone -q {ROOT} {m[1]} && cd {m[1]}"
    if command == diagnosis.INSTALL_COMMAND:
        # hluk's installer: its hosts are out of reach here, and the stand-in is the hluk.
        return ":"
    if m := PIP.fullmatch(command):
        extras = (m[2] or "").split(",") if m[2] else []
        declared = declared_extras()
        for extra in extras:
            assert extra in declared, f"{command}: no extra {extra!r}"
        ci = (ROOT / ".ci" / "run").read_text()
        for pin in m[3].split():
            assert pin in ci, f"{command}: CI does not test with {pin}"
        if m[4]:
            assert "&& pytest)" in ci, "CI runs another test command than the docs name"
        # This environment has the package with those extras: installing is CI's own step.
        return ":"
    if m := VERL_RUN.fullmatch(command):
        # A training run: its overrides are checked against verl's own config
        # (test_the_docs_verl_overrides_are_verls_own).
        return ":"
    if m := RAY_JOIN.fullmatch(command):
        # A node joining a cluster (HEAD is the reader's): it offers what `?ray` asks for.
        assert DEFAULT_RESOURCE in json.loads(shlex.split(m[1])[0]), command
        return ":"
    if m := SERVE.fullmatch(command):
        if m[2]:
            return command
        # A server in the foreground: started, seen ready and stopped, as its reader would.
        return f"{command} & ready {port}; kill -TERM $!; wait $! || [ $? = 143 ]"
    if command.startswith("verl-hyperlight doctor") and not kvm_usable():
        # Without KVM here, doctor must fail its /dev/kvm check (the stand-in needs none) and
        # nothing else.
        out = tmp_path / "doctor.out"
        only_kvm = f"[ \"$(grep -cE '^fail ' {out})\" = 1 ] && grep -qE '^fail +/dev/kvm ' {out}"
        return (
            f"! {command} > {out}; cat {out}; "
            f"{only_kvm} || {{ echo 'doctor failed on more than /dev/kvm' >&2; exit 1; }}"
        )
    assert "<" not in command.replace("<<<", ""), f"a placeholder no rule replaces: {command}"
    return command


def kvm_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def declared_extras() -> list[str]:
    return importlib.metadata.metadata("verl-hyperlight").get_all("Provides-Extra") or []


def check_yaml(block: Block, caplog: pytest.LogCaptureFixture) -> None:
    """A tool config (whole, or the `config:` line of one) as verl's tool loader gives it to
    the tool; a KubeRay worker group as `ray start` reads its resources."""
    loaded = yaml.safe_load(textwrap.dedent(block.body))
    if "workerGroupSpecs" in loaded:
        for group in loaded["workerGroupSpecs"]:
            # KubeRay passes it as `ray start --resources=<this>`: the shell's quotes removed.
            resources = json.loads(shlex.split(group["rayStartParams"]["resources"])[0])
            assert DEFAULT_RESOURCE in resources, resources
            volumes = group["template"]["spec"]["volumes"]
            assert {"path": "/dev/kvm", "type": "CharDevice"} in [v["hostPath"] for v in volumes]
        return
    tools = loaded["tools"] if "tools" in loaded else [{"config": loaded["config"]}]
    for tool in tools:
        if "class_name" in tool:
            module, _, name = tool["class_name"].rpartition(".")
            assert (module, name) == ("verl_hyperlight.tool", "CodeInterpreterTool"), tool
        with caplog.at_level(logging.WARNING):
            settings_ = ToolSettings.from_config(tool["config"])
        assert not caplog.records, [record.getMessage() for record in caplog.records]
        assert is_ours(settings_.url)


def documented_training_runs() -> list[tuple[list[str], str]]:
    """The overrides of every `python -m verl.trainer.main_ppo` line of the examples, each with
    the verl versions its comment names ("" when it names none)."""
    runs = []
    for example in EXAMPLES:
        if example.block.language != "bash":
            continue
        for line in logical_lines(example.block.body):
            command, _, comment = line.partition("  # ")
            if m := VERL_RUN.fullmatch(command.strip()):
                runs.append((shlex.split(m[1]), comment.strip()))
    return runs


def test_the_docs_verl_overrides_are_verls_own() -> None:
    """Each documented training run's overrides compose with the installed verl's trainer
    config, where the line is for that verl: a misspelt key fails, as verl would."""
    verl = pytest.importorskip("verl", reason="needs verl (CI's verl leg runs it)")
    hydra = pytest.importorskip("hydra")
    from omegaconf import OmegaConf

    installed = release(verl.__version__)
    checked = 0
    for overrides, versions in documented_training_runs():
        if versions:
            low, high = versions.removeprefix("verl ").split(" - ")
            if not release(low) <= installed <= release(high, last=True):
                continue
        with hydra.initialize_config_module("verl.trainer.config", version_base=None):
            config = hydra.compose("ppo_trainer", overrides=overrides)
        for override in overrides:
            key, _, value = override.partition("=")
            assert str(OmegaConf.select(config, key)) == value, override
        checked += 1
    assert checked >= 2


def release(version: str, last: bool = False) -> tuple[int, ...]:
    """ "0.9.1" as (0, 9, 1); "0.9.x", or "0.9" with `last`, as the last 0.9 release."""
    parts = version.split(".")
    parts += ["x" if last else "0"] * (3 - len(parts))
    return tuple(10**6 if part == "x" else int(part) for part in parts[:3])


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_each_page_opens_with_its_title(page: str) -> None:
    first = (DOCS / page).read_text().splitlines()[0]
    assert first.startswith("# "), first


# The built site as a person sees it: headless Chromium (Debian's, which .ci/run installs)
# driven by Playwright. CI keeps the screenshots in .ci/screenshots (CI_SCREENSHOTS).
SITE_PAGES = {"home": "", "settings": "reference/settings/", "troubleshooting": "troubleshooting/"}


def build_site(root: Path, built: Path) -> subprocess.CompletedProcess[str]:
    """mkdocs's build of the site at `root`, with the options .ci/run builds it with."""
    (line,) = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip().startswith("NO_MKDOCS_2_WARNING=1 mkdocs ")
    ]
    words = shlex.split(line)
    assert words[:3] == ["NO_MKDOCS_2_WARNING=1", "mkdocs", "build"], line
    options = [word for word in words[3:] if word.startswith("--") and word != "--site-dir"]
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", *options, "--site-dir", str(built)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_cis_build_fails_on_a_broken_link_or_anchor(tmp_path: Path) -> None:
    """--strict alone: mkdocs 1.6's --quiet hides its warnings from --strict too, and a build
    with a dead link and a dead anchor passed."""
    pytest.importorskip("mkdocs", reason="the docs extra builds the site")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copytree(DOCS, copy / "docs")
    for page, link in (("why.md", "nowhere.md"), ("sizing.md", "getting-started.md#nowhere")):
        with (copy / "docs" / page).open("a") as text:
            text.write(f"\n[a link]({link})\n")
    built = build_site(copy, tmp_path / "site")
    assert built.returncode != 0
    said = built.stdout + built.stderr
    assert "'nowhere.md', but the target is not found" in said, said
    assert "does not contain an anchor '#nowhere'" in said, said


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The docs site built as CI builds it, served on a free loopback port: its base URL."""
    pytest.importorskip("mkdocs", reason="the docs extra builds the site")
    built = tmp_path_factory.mktemp("site")
    done = build_site(ROOT, built)
    assert done.returncode == 0, done.stdout + done.stderr

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(built))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="the screenshots extra")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on PATH (.ci/run installs Debian's)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium,
            # As root in a container, with no network beyond loopback.
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield launched
        finally:
            launched.close()


def screenshots(tmp_path: Path) -> Path:
    kept = os.environ.get("CI_SCREENSHOTS")
    folder = Path(kept) if kept else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.parametrize("name", sorted(SITE_PAGES))
def test_a_page_of_the_site_shows_its_navigation_and_search_box(
    name: str, site: str, browser: Any, tmp_path: Path
) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    titles = [next(iter(entry)) for entry in config["nav"]]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    try:
        page.goto(site + SITE_PAGES[name], wait_until="networkidle")
        # Nothing from beyond the site (no web fonts): it reads the same on an air-gapped node.
        assert [url for url in asked if not url.startswith(site)] == []
        navigation = page.locator("nav.md-nav--primary")
        assert navigation.first.is_visible()
        for title in titles:
            shown = navigation.first.get_by_text(title, exact=True)
            assert any(shown.nth(i).is_visible() for i in range(shown.count())), title
        search = page.locator("input.md-search__input")
        assert search.is_visible()
        box = search.bounding_box()
        assert box is not None and box["width"] > 100 and box["y"] < 60  # in the header
        page.screenshot(path=str(screenshots(tmp_path) / f"{name}.png"))
    finally:
        page.close()


def test_the_sites_search_finds_a_setting(site: str, browser: Any, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(site, wait_until="networkidle")
        # As a person does: a click in the box, then the keys.
        page.locator("input.md-search__input").click()
        page.keyboard.type("HLUK_PATH", delay=20)
        results = page.locator(".md-search-result__item")
        results.first.wait_for(state="visible", timeout=30_000)
        assert "HLUK_PATH" in results.first.inner_text()
        assert "matching document" in page.locator(".md-search-result__meta").inner_text()
        page.screenshot(path=str(screenshots(tmp_path) / "search.png"))
    finally:
        page.close()


def site_paths() -> list[str]:
    """Every page of the site, as its URL path (mkdocs' directory URLs)."""
    paths = []
    for page in sorted(DOCS.rglob("*.md")):
        relative = page.relative_to(DOCS).with_suffix("")
        paths.append("" if relative.name == "index" else f"{relative.as_posix()}/")
    return paths


def test_no_code_block_of_the_site_scrolls_sideways_at_1280_px(site: str, browser: Any) -> None:
    """A newcomer found code blocks clipped at 1280 px (the installer's URL, the run_code call):
    every block of every page fits or wraps, so nothing of a command hides past the edge."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    clipped: list[str] = []
    try:
        for path in site_paths():
            page.goto(site + path, wait_until="networkidle")
            widths = page.eval_on_selector_all(
                ".md-content pre > code",
                "blocks => blocks.map(b => [b.scrollWidth, b.clientWidth, b.innerText])",
            )
            assert widths or path not in ("", "serve/"), path  # pages with blocks seen
            clipped += [
                f"{path}: {text.splitlines()[0][:60]!r} ({scroll} > {client} px)"
                for scroll, client, text in widths
                if scroll > client + 1
            ]
    finally:
        page.close()
    assert clipped == []


def sections(page: Path) -> list[tuple[str, int]]:
    """Each section of `page` (its text under a heading, down to the next of any level), with
    its words of prose (code blocks left out)."""
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    parts = re.split(r"^(#{1,4} .*)$", text, flags=re.MULTILINE)
    found = [("(before any heading)", len(parts[0].split()))]
    found += [(parts[i], len(parts[i + 1].split())) for i in range(1, len(parts), 2)]
    return found


def test_every_section_of_a_page_is_short_enough_to_skim() -> None:
    """A newcomer found serve.md, agent-tools.md and operations.md running 1,300-2,300 words
    under one heading: each section is under ~800 words, so a page's table of contents finds
    the task."""
    long = [
        f"{page.relative_to(ROOT)} {heading!r}: {words} words"
        for page in [README, *sorted(DOCS.rglob("*.md"))]
        for heading, words in sections(page)
        if words > 800
    ]
    assert long == []


# What reads as a reference to another part of a page ("see above") without being a link.
# ("see How it works": a page named, not linked).
VAGUE = re.compile(
    r"\b(?:see|the \w+) (?:above|below)\b|\((?:above|below)\)|\bsee (?-i:[A-Z])[\w-]*(?: [a-z]+)*",
    re.IGNORECASE,
)


def test_every_cross_reference_is_a_link_or_a_path_that_exists() -> None:
    """ "see above" on agent-tools.md, "the rule above" on operations.md, "see README" in
    examples/code_tool.yaml, docs/hluk.md (which is no file of this repository) in the
    stand-in: each names where it points, and what it names exists."""
    vague = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        text = re.sub(r"\[[^\]]*\]\([^)]*\)", "", page.read_text())  # links point somewhere
        text = re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)
        vague += [f"{page.relative_to(ROOT)}: {m[0]!r}" for m in VAGUE.finditer(text)]
    assert vague == []
    files = [
        *sorted((ROOT / "examples").iterdir()),
        *sorted((ROOT / "tests" / "standin").iterdir()),
    ]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        assert "see README" not in text, path
        for named in re.findall(r"\b((?:docs|examples|tests)/[\w./-]+\.(?:md|py|yaml|sh))", text):
            assert (ROOT / named).exists(), f"{path.relative_to(ROOT)} names {named}"
