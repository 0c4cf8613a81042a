"""The documentation's own rules: every code block of README.md and docs/*.md is run by a
test or marked as not runnable; every relative link and anchor resolves; the README stays
a short tour with one page per capability; docs/operations.md names every environment
variable the code reads; BENCHMARKS.md opens with the current figures."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import test_docs_in_process, test_readme_tour
from tests.memories.tools import test_readme_function_calling
from tests.readme import DOCS, README, ROOT, all_blocks, page_blocks, pages

CAPABILITY_PAGES = [
    "docs/knowledge.md", "docs/memory-bases.md", "docs/conversations.md",
    "docs/memory-stores.md", "docs/personal-memories.md", "docs/engine.md", "docs/tools.md",
]  # fmt: skip
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_block_is_run_or_marked_not_runnable():
    unmarked = [b.where for b in all_blocks() if b.kind is None]
    assert unmarked == [], (
        "blocks without <!-- run: ID -->, <!-- file: NAME --> or <!-- not run: REASON --> "
        f"on the line before: {unmarked}"
    )
    reasonless = [b.where for b in all_blocks() if b.kind == "not run" and len(b.name) < 10]
    assert reasonless == []


def test_every_run_block_is_claimed_by_exactly_one_test():
    runs = [b.name for b in all_blocks() if b.kind == "run"]
    assert sorted(set(runs)) == sorted(runs), "run ids must be unique"
    claims = [
        *test_readme_tour.CHECKS,
        *test_docs_in_process.IN_PROCESS,
        *test_readme_function_calling.RUNS,
    ]
    assert sorted(claims) == sorted(set(claims)), "a block claimed by two tests"
    assert sorted(claims) == sorted(runs), "run blocks no test runs, or claims of no block"


def test_run_blocks_are_shell_or_python():
    assert {b.language for b in all_blocks() if b.kind == "run"} <= {"sh", "python"}


def test_file_blocks_are_used_by_a_later_block_of_their_page():
    for path in pages():
        blocks = page_blocks(path)
        for at, block in enumerate(blocks):
            if block.kind == "file":
                later = "".join(b.text for b in blocks[at + 1 :] if b.kind == "run")
                assert block.name in later, f"{block.where}: {block.name} is never used"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_relative_links_and_anchors_resolve():
    broken = []
    for path in [*pages(), ROOT / "BENCHMARKS.md"]:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                broken.append(f"{path.name}: {target} (no such file)")
                continue
            if anchor and resolved.is_file() and anchor not in _anchors(resolved):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_is_a_short_tour_with_a_page_per_capability():
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    assert "make run" in text and "make test" in text
    for page in [
        *CAPABILITY_PAGES,
        "docs/operations.md",
        "docs/api.md",
        "docs/memory-formation.md",
    ]:
        assert (ROOT / page).is_file(), page
        assert f"]({page}" in text, f"the README does not link {page}"
    for page in ["docs/engine.md", "docs/personal-memories.md"]:
        assert "memory-formation.md" in (ROOT / page).read_text()
    assert "docs/memory-formation.md" in text


def _environment_variables_read() -> set[str]:
    """Every name the service reads from the environment: the settings' typed readers
    (env_str("X"), ...) and os.environ / os.getenv outside the tests. A setdefault is a
    write (the test settings pin a library's thread count), not a read."""
    names: set[str] = set()
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in {"tests", "bench", "scripts"} or any(
            part.startswith(".") for part in relative.parts
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = _read_name(node)
            if name:
                names.add(name)
    return names - {"TESTING", "DJANGO_SETTINGS_MODULE"}  # the test run's, and Django's own


def _read_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = ast.unparse(node.func)
        if re.fullmatch(r"env_\w+|os\.getenv|os\.environ\.(get|pop)", func):
            return node.args[0].value
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
        if isinstance(node.slice, ast.Constant):
            return node.slice.value
    return None


def test_operations_names_every_environment_variable():
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", (DOCS / "operations.md").read_text()))
    read = _environment_variables_read()
    assert sorted(read - documented) == []


def _env_example() -> dict[str, bool]:
    """.env.example's variables (set, or commented out as ``# NAME=``), each with whether
    it has a comment (on its line, or a comment line just above)."""
    found: dict[str, bool] = {}
    previous = ""
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.match(r"#? ?([A-Z][A-Z0-9_]+)=", line)
        if match:
            explained = " #" in line[match.end() :] or (
                previous.startswith("#") and "=" not in previous
            )
            found[match.group(1)] = explained
        previous = line
    return found


def test_env_example_lists_exactly_the_variables_the_code_reads():
    example = _env_example()
    read = _environment_variables_read()
    assert sorted(read - set(example)) == []  # read but not listed
    assert sorted(set(example) - read) == []  # listed but read by nothing
    # Ranking and plan constants are not variables (issue 22): what remains is what a
    # deployment sets (database, providers and keys, limits, schedules, security, the
    # standard OTEL_* switches of traces).
    assert len(read) <= 60
    assert sorted(name for name, explained in example.items() if not explained) == []


def test_benchmarks_open_with_the_current_figures():
    text = (ROOT / "BENCHMARKS.md").read_text()
    first_section = text.split("\n## ", 2)[1]
    assert first_section.startswith("Current figures")
    header = next(line for line in first_section.splitlines() if line.startswith("|"))
    assert [c.strip() for c in header.strip("|").split("|")][:5] == [
        "benchmark", "figure", "command", "date", "machine"
    ]  # fmt: skip


def test_the_variables_no_longer_read_are_not_read_and_are_in_the_upgrade_notes():
    from core.checks import NO_LONGER_READ

    assert sorted(NO_LONGER_READ & _environment_variables_read()) == []
    notes = (DOCS / "operations.md").read_text().split("## Upgrades", 1)[1]
    named = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", notes))
    assert sorted(NO_LONGER_READ - named) == []
