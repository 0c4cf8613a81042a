"""Every third-party package the code, the tests or the docs' examples import is pinned
exactly in requirements*.txt (at the version installed), and none of them reaches into a
package's private modules (``mcp.shared._httpx_utils`` breaks on any SDK release)."""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from importlib.metadata import packages_distributions, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"core", "memories", "knowledge", "ingestion", "memoryproject", "tests", "scripts",
               "bench", "manage", "bench_knowledge", "bench_search_ab"}  # fmt: skip
RUNTIME = {"core", "memories", "knowledge", "ingestion", "memoryproject", "manage.py"}
# Private modules still imported on purpose, each with the reason.
KNOWN_PRIVATE = {
    "pgserver._commands": "the embedded server's binaries; core/embedded_pg.py, not this change",
}
PYTHON_BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^[ \t]*```", re.S | re.M)


def _imports(source: str) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] not in FIRST_PARTY | sys.stdlib_module_names]


def _sources() -> list[tuple[str, str]]:
    """(where, source): the repository's Python files and the Python blocks of README.md
    and docs/*.md."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if any(part.startswith(".") or part == "node_modules" for part in relative.parts):
            continue
        found.append((relative.parts[0], path.read_text()))
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = PYTHON_BLOCK.findall(page.read_text())
        where = page.relative_to(ROOT).as_posix()  # not runtime code: dev pins count
        found += [(where, textwrap.dedent(block)) for _, block in blocks]
    return found


def _pins(*files: str) -> dict[str, str]:
    pins = {}
    for name in files:
        for line in (ROOT / name).read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s#]+)", line.strip())
            if match:
                pins[_normal(match[1])] = match[2]
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_pinned_at_the_installed_version():
    distributions = packages_distributions()
    runtime_pins = _pins("requirements.txt")
    all_pins = _pins("requirements.txt", "requirements-dev.txt")
    problems = []
    for where, source in _sources():
        pins = runtime_pins if where in RUNTIME else all_pins
        for name in _imports(source):
            for dist in distributions.get(name.split(".")[0], []):  # not installed: optional
                pinned = pins.get(_normal(dist))
                if pinned != version(dist):
                    problems.append(f"{where} imports {name}: {dist} {version(dist)} pinned "
                                    f"{pinned!r}")  # fmt: skip
    assert sorted(set(problems)) == []


def test_no_private_module_of_a_package_is_imported():
    private = {
        (where, name)
        for where, source in _sources()
        for name in _imports(source)
        if any(part.startswith("_") for part in name.split(".")[1:]) and name not in KNOWN_PRIVATE
    }
    assert sorted(private) == []
