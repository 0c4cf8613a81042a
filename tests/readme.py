"""The code blocks of README.md and docs/*.md, found by the marker above each one.

Every fenced block carries an HTML comment on the line before it (blank lines between
are allowed):

- ``<!-- run: ID -->``: a test runs it as written and checks what it did; ``ID`` is
  unique across the pages. Shell blocks of a page run in order in one bash (after the
  README's ``setup`` block, for the pages under docs/), so a later block uses the
  variables of an earlier one.
- ``<!-- file: NAME -->``: the block is a file the page's later blocks use; the shell
  session writes it to ``NAME`` in its working directory at that point.
- ``<!-- not run: REASON -->``: not runnable (a client's configuration, a sample output,
  something that needs Docker); the reason says why.

``tests/test_docs.py`` fails on a block with none of these, and on a ``run`` block no test
claims.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!--\s*(run|file|not run):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
SEPARATOR = "@@docs-block@@ "


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/knowledge.md
    line: int  # of the opening fence, 1-based
    language: str
    kind: str | None  # run, file, not run; None when unmarked
    name: str  # the run id, the file name, or the reason
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order, with their markers."""
    lines = path.read_text().splitlines(keepends=True)
    page = path.relative_to(ROOT).as_posix()
    found: list[Block] = []
    at = 0
    while at < len(lines):
        opening = FENCE.match(lines[at])
        if opening is None:
            at += 1
            continue
        indent, language = opening.groups()
        end = at + 1
        while end < len(lines) and not re.match(rf"^{indent}```\s*$", lines[end]):
            end += 1
        body = "".join(line.removeprefix(indent) for line in lines[at + 1 : end])
        kind, name = _marker(lines, at)
        found.append(Block(page, at + 1, language, kind, name, body))
        at = end + 1
    return found


def _marker(lines: list[str], fence: int) -> tuple[str | None, str]:
    before = fence - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    match = MARKER.match(lines[before].strip()) if before >= 0 else None
    return (match.group(1), match.group(2)) if match else (None, "")


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in page_blocks(path)]


def run_block(run_id: str) -> Block:
    matches = [b for b in all_blocks() if b.kind == "run" and b.name == run_id]
    assert len(matches) == 1, f"{len(matches)} blocks marked run: {run_id}"
    return matches[0]


def readme_block(marker: str, language: str) -> str:
    """The text of the block marked ``<!-- run: marker -->`` (in README.md or docs/)."""
    block = run_block(marker)
    assert block.language == language, f"{block.where} is {block.language}, not {language}"
    return block.text


def shell_script(blocks: list[Block]) -> str:
    """One bash script running ``blocks`` in order: ``run`` blocks each after a separator
    line naming them, ``file`` blocks written where they stand."""
    parts = []
    for block in blocks:
        if block.kind == "file":
            parts.append(f"cat > {shlex.quote(block.name)} <<'DOCS_BLOCK_EOF'\n")
            parts.append(f"{block.text}DOCS_BLOCK_EOF\n")
        else:
            parts.append(f"printf '\\n{SEPARATOR}%s\\n' {shlex.quote(block.name)}\n{block.text}")
    return "".join(parts)


def run_shell(
    blocks: list[Block], *, cwd: Path, env: dict[str, str], timeout: float = 600
) -> dict[str, str]:
    """Run the blocks in one ``bash -euo pipefail``; what each printed, by run id."""
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", shell_script(blocks)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert ran.returncode == 0, f"exit {ran.returncode}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    outputs: dict[str, str] = {}
    current: str | None = None
    for line in ran.stdout.splitlines(keepends=True):
        if line.startswith(SEPARATOR):
            current = line.removeprefix(SEPARATOR).strip()
            outputs[current] = ""
        elif current is not None:
            outputs[current] += line
    return {name: text.strip("\n") for name, text in outputs.items()}


def workdir_like_a_checkout(path: Path) -> Path:
    """A directory whose entries are links to the repository's, so that blocks run as in
    a checkout (``.venv/bin/python manage.py``, ``./docs``) and the files they write
    (``memory.yaml``, ``memory.dump``) land outside it."""
    path.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".data"} and not (path / entry.name).exists():
            os.symlink(entry, path / entry.name)
    return path
