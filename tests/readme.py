"""The README's code blocks that tests run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(marker: str, language: str) -> str:
    """The first ``language`` code block after the ``<!-- marker:`` comment."""
    text = README.read_text()
    start = text.index(f"<!-- {marker}:")
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match is not None, f"no {language} block after the {marker} marker"
    return match.group(1)
