"""ARCHITECTURE.md stays true: every module it names exists, and imports run downward."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "verl_hyperlight"
DOCUMENT = ROOT / "ARCHITECTURE.md"

# The rooms, bottom to top, as ARCHITECTURE.md draws them. A module may import modules of its
# own room, of a room on a lower level, and (in the foundation) the foundation modules listed
# before it.
FOUNDATION = ("cancel", "errors", "node", "settings", "deadlines", "outcome", "diagnosis")
LEVELS: tuple[tuple[str, ...], ...] = (
    ("guest",),
    FOUNDATION,
    ("hluk",),
    ("case",),
    ("agent", "server"),
    ("commands",),
    ("plugin", "tool", "cli", "__init__"),
)
LEVEL = {room: level for level, rooms in enumerate(LEVELS) for room in rooms}


def _room(module: str) -> str:
    """The room of a module named relative to the package (``case.api`` -> ``case``)."""
    return module.split(".", 1)[0] if module else "__init__"


def _imports() -> list[tuple[str, str]]:
    """(importer, imported) for every import of the package's own modules, relative to the
    package, function-level imports included."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        here = parts if is_package else parts[:-1]
        module = ".".join(parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                elif (node.module or "").startswith("verl_hyperlight"):
                    target = node.module.removeprefix("verl_hyperlight").lstrip(".")
                else:
                    continue
                for alias in node.names:
                    named = f"{target}.{alias.name}" if target else alias.name
                    is_module = (PACKAGE / f"{named.replace('.', '/')}.py").exists() or (
                        PACKAGE / named.replace(".", "/")
                    ).is_dir()
                    found.append((module, named if is_module else target))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("verl_hyperlight"):
                        found.append(
                            (module, alias.name.removeprefix("verl_hyperlight").lstrip("."))
                        )
    return found


def _allowed(importer: str, imported: str) -> bool:
    source, target = _room(importer), _room(imported)
    if source == target:
        return True
    if target == "__init__":
        # The package root (its version, its lazy run_code) is for the entry points alone.
        return LEVEL[source] == LEVEL["__init__"]
    if source in FOUNDATION and target in FOUNDATION:
        return FOUNDATION.index(target) < FOUNDATION.index(source)
    return LEVEL[target] < LEVEL[source]


def test_every_module_belongs_to_a_room_of_the_drawing() -> None:
    rooms = {_room(module) for module, _ in _imports()} | {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").exists())
    }
    assert rooms <= set(LEVEL), f"rooms ARCHITECTURE.md does not draw: {rooms - set(LEVEL)}"


def test_imports_run_downward_only() -> None:
    wrong = sorted(
        f"{importer or '__init__'} imports {imported}"
        for importer, imported in _imports()
        if not _allowed(importer, imported)
    )
    assert not wrong, "imports against ARCHITECTURE.md's rules:\n" + "\n".join(wrong)


def test_the_guest_imports_nothing_of_the_host() -> None:
    host = [(a, b) for a, b in _imports() if _room(a) == "guest" and _room(b) != "guest"]
    assert not host


def test_the_rule_checker_sees_an_upward_import() -> None:
    # The checker itself: an import from the case path into the server, or from hluk into
    # the case path, is refused; the ones the drawing allows are not.
    assert not _allowed("case.api", "server.app")
    assert not _allowed("hluk.watch", "case.gate")
    assert not _allowed("agent.calls", "server.app")
    assert not _allowed("agent.notebook", "commands.selftest")
    assert _allowed("commands.selftest", "agent.notebook")
    assert not _allowed("errors", "diagnosis")
    assert _allowed("diagnosis", "errors")
    assert _allowed("server.app", "case.api")
    assert ("case.api", "hluk.watch") in _imports()


def _named_paths() -> list[str]:
    """The module and room paths ARCHITECTURE.md names, resolved against the package: in the
    table of rooms relative to its row's room, elsewhere relative to the package."""
    named = []
    for line in DOCUMENT.read_text().splitlines():
        tokens = re.findall(r"`([\w/]+(?:\.py|/))`", line)
        room = ""
        if line.startswith("| `"):
            first = tokens[0] if tokens else ""
            room = first if first.endswith("/") else ""
        for token in tokens:
            if token.startswith(("src/", "tests/")):
                continue  # the repository's, checked below
            if room and token != room and not (PACKAGE / token).exists():
                token = room + token
            elif not room and "/" not in token:
                # A module named alone in the prose: the one of that name in the package.
                found = [path.relative_to(PACKAGE) for path in PACKAGE.rglob(token)]
                token = str(found[0]) if len(found) == 1 else token
            named.append(token)
    return named


@pytest.mark.parametrize("path", sorted(set(_named_paths())))
def test_every_module_the_document_names_exists(path: str) -> None:
    assert (PACKAGE / path).exists(), f"ARCHITECTURE.md names {path}, which is not in the package"


def test_the_repository_paths_the_document_names_exist() -> None:
    paths = re.findall(r"`((?:src|tests)/[\w/.]+)`", DOCUMENT.read_text())
    assert paths
    assert [path for path in paths if not (ROOT / path).exists()] == []


def test_the_document_names_every_room() -> None:
    named = set(_named_paths())
    for path in PACKAGE.iterdir():
        if (path / "__init__.py").exists():
            assert f"{path.name}/" in named
        elif path.suffix == ".py" and path.name != "__init__.py":
            assert path.name in named


def test_every_install_hint_installs_this_package_from_a_checkout() -> None:
    """On the package index the name verl-hyperlight is another project's: no message may tell
    a user to `pip install` it by name. The one spelling of the command is diagnosis.install."""
    from verl_hyperlight import diagnosis

    by_name = re.compile(r"pip install (-[-\w]+ )*['\"]?verl-hyperlight")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if by_name.search(line)
    ]
    assert found == []
    said = diagnosis.install("serve")
    assert said == "pip install -e '.[serve]' in your verl-hyperlight checkout"
    assert diagnosis.install(again=True).startswith("pip install --force-reinstall -e . in")


def _module_trees() -> dict[str, ast.Module]:
    """Each module of the package (but the guest's), by its name relative to the package."""
    trees = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[0] == "guest":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        trees[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return trees


def _importing(names: tuple[str, ...]) -> set[str]:
    """The modules that import any of `names` (top-level packages), function-level too."""
    found = set()
    for module, tree in _module_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] in names for name in imported):
                found.add(module)
    return found


def test_ray_is_imported_by_its_one_home_and_its_options_spelled_there() -> None:
    assert _importing(("ray",)) == {"case.cluster"}
    spelled = {
        module
        for module, tree in _module_trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg in ("num_cpus", "resources", "max_retries")
    }
    assert spelled == {"case.cluster"}


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (function-level imports included)."""
    modules = set(_module_trees())
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for importer, imported in _imports():
        if importer in graph and imported in modules and imported != importer:
            graph[importer].add(imported)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: each a path that comes back to where it began."""
    circles, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state[target] == 1:
                circles.append([*path[path.index(target) :], target])
            elif state[target] == 0:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [module])
    return circles


def test_the_import_graph_has_no_circle() -> None:
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


# What outside code calls (verl, uvicorn, prometheus, the console script), not this package.
CALLED_FROM_OUTSIDE = {
    "cli.main",  # the console script
    "tool.CodeInterpreterTool",  # verl's tool registry, by its class_name
    "CodeInterpreterTool.create",  # verl's agent loop, on the BaseTool it subclasses
    "CodeInterpreterTool.execute",
    "CodeInterpreterTool.calc_reward",
    "CodeInterpreterTool.release",
    "CodeInterpreterTool.get_openai_tool_schema",
    "BackendFailures.collect",  # prometheus_client, on every collector registered
    "ReadyGuestsTaken.collect",
    "NotebookHost.cancel_call",  # Ray, on the actor's handle, by the name cluster.Actor is given
    "NotebookHost.placed",
}


def _public_definitions() -> list[tuple[str, str, bool]]:
    """(module, name, is_method) of every public function, class and method of the package
    (but the guest's, which runs in the micro-VM: the host never calls it by name)."""
    found = []
    for module, tree in _module_trees().items():
        for node in tree.body:
            defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if isinstance(node, defined) and not node.name.startswith("_"):
                found.append((module, node.name, False))
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for item in node.body:
                    method = (ast.FunctionDef, ast.AsyncFunctionDef)
                    if isinstance(item, method) and not item.name.startswith("_"):
                        found.append((node.name, item.name, True))
    return found


def _uses() -> tuple[set[tuple[str, str]], set[str]]:
    """What the package's own code uses: (module, name) pairs of module-level names (by name in
    their module, or through an import), and every attribute name read."""
    named: set[tuple[str, str]] = set()
    attributes: set[str] = set()
    trees = _module_trees()
    for module, tree in trees.items():
        here = (
            module.split(".")
            if (PACKAGE / module.replace(".", "/")).is_dir()
            else (module.split(".")[:-1])
        )
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [node.module])])
                for alias in node.names:
                    full = f"{base}.{alias.name}" if base else alias.name
                    if full in trees:
                        aliases[alias.asname or alias.name] = full
                    else:
                        named.add((base, alias.name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attributes.add(node.attr)
                if isinstance(node.value, ast.Name) and node.value.id in aliases:
                    named.add((aliases[node.value.id], node.attr))
            elif isinstance(node, ast.Name):
                named.add((module, node.id))
    return named, attributes


def test_no_public_function_in_src_is_there_for_the_tests_alone() -> None:
    named, attributes = _uses()
    unused = [
        f"{owner}.{name}"
        for owner, name, is_method in _public_definitions()
        if not (name in attributes if is_method else (owner, name) in named)
        and f"{owner}.{name}" not in CALLED_FROM_OUTSIDE
        and not name.startswith("__")
    ]
    assert unused == [], "public, but nothing in src/ uses it: " + ", ".join(unused)


def _calls_in(tree: ast.AST, text: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == text
    ]


def test_the_http_url_test_and_the_nodes_memory_have_one_home_each() -> None:
    for text, home in (
        ("http://", "case.url"),
        ("SC_PHYS_PAGES", "node"),
        ("MemAvailable:", "node"),
    ):
        places = {module for module, tree in _module_trees().items() if _calls_in(tree, text)}
        assert places == {home}, text
    affinity = {
        module
        for module, tree in _module_trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("sched_getaffinity", "cpu_count")
    }
    assert affinity == {"node"}
