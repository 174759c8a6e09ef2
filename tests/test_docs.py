"""The README (the front door) and the docs site (mkdocs.yml, docs/): what they show runs, every
page is reachable, and the settings reference is the settings module's. CI builds the site with
`mkdocs build --strict` (.ci/run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from serving import Served

from verl_hyperlight import settings

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


def test_the_readmes_python_example_prints_what_it_shows(hluk: Path) -> None:
    (code,) = fenced(README.read_text(), "python")
    (shown,) = fenced(README.read_text(), "text")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown


def test_the_readmes_curl_gets_the_reply_it_shows(serve: Callable[..., Served]) -> None:
    text = README.read_text()
    body = json.loads(re.search(r"-d '(\{.*\})'", text)[1])  # type: ignore[index]
    assert "-H 'Content-Type: application/json'" in text
    (shown,) = fenced(text, "json")
    reply = serve().post(body)
    assert reply.status_code == 200
    answer, expected = reply.json(), json.loads(shown)
    for response in (answer, expected):
        response["run_result"].pop("execution_time")
    assert answer == expected


def test_trying_it_without_kvm_runs_as_the_readme_shows(
    standin_env: dict[str, str], tmp_path: Path
) -> None:
    text = README.read_text()
    section = text[text.index("## Try it without KVM") :]
    assert (
        "export HLUK_PATH=$PWD/tests/standin/hluk VERL_HYPERLIGHT_HLUK_ENV='HLUK_STANDIN_*'"
        in section
    )
    assert "verl-hyperlight run examples/hello.py <<< olleh" in section
    cli = "import sys; from verl_hyperlight.cli import main; sys.exit(main(sys.argv[1:]))"
    environment = {
        **os.environ,
        "HLUK_PATH": str(ROOT / "tests" / "standin" / "hluk"),
        "VERL_HYPERLIGHT_HLUK_ENV": "HLUK_STANDIN_*",
        "HLUK_STANDIN_BWRAP": standin_env["HLUK_STANDIN_BWRAP"],
        "HLUK_CACHE_DIR": standin_env["HLUK_CACHE_DIR"],
    }
    done = subprocess.run(
        [sys.executable, "-c", cli, "run", "examples/hello.py"],
        input="olleh\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run_result"]["stdout"] == "hello\n"


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_each_page_opens_with_its_title(page: str) -> None:
    first = (DOCS / page).read_text().splitlines()[0]
    assert first.startswith("# "), first
