"""Load an older checkout's knowledge search next to this checkout's, for paired benchmarks.

The search of ``c246bc8`` and earlier lived in ``knowledge/search.py`` with its siblings
``bm25.py``, ``fusion.py`` and ``prepared.py``, and read its ranking constants from
settings. This loads those four files of ``checkout`` as the package ``knowledge_before``
(their ``from knowledge import ...`` of one another pointing at it; the models and
selectors stay this checkout's, which are the same tables), and puts the settings they read
back in ``django.conf.settings`` with the values they had, so both searches run in one
process on the same data, query by query.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Any

from django.conf import settings

OLD_SETTINGS = {
    "SEARCH_EXACT_MAX_ROWS": 10000,
    "SEARCH_MAX_SCAN_TUPLES": 100000,
    "SEARCH_FUSION": "weighted",
    "SEARCH_VECTOR_WEIGHT": 0.4,
    "SEARCH_CANDIDATES": 50,
    "SEARCH_CONTEXT_WEIGHT": 0.5,
    "SEARCH_CONTEXT_WINDOW": 2,
    "SEARCH_RRF_K": 10,
    "SEARCH_BM25_K1": 1.2,
    "SEARCH_BM25_B": 0.3,
    "SEARCH_BM25_PRUNE": True,
    "SEARCH_EF_SEARCH": 100,
    "SEARCH_EF_SEARCH_SCALE": True,
    "SEARCH_ITERATIVE_SCAN": "strict_order",
    "SEARCH_PARALLEL_LEGS": True,
    "SEARCH_PARALLEL_WORKERS": 4,
    "SEARCH_ONE_STATEMENT": True,
    "SEARCH_SPLIT_MIN_ROWS": 2000,
}
_SIBLINGS = ("prepared", "fusion", "bm25", "search")


def load_before(checkout: Path) -> Any:
    """The older checkout's ``knowledge/search.py`` as a module (``knowledge_before.search``)."""
    for name, value in OLD_SETTINGS.items():
        if not hasattr(settings, name):
            setattr(settings, name, value)
    package = types.ModuleType("knowledge_before")
    package.__path__ = []  # a package, so that its submodules resolve
    sys.modules["knowledge_before"] = package
    for name in _SIBLINGS:
        path = checkout / "knowledge" / f"{name}.py"
        source = path.read_text()
        source = re.sub(
            r"from knowledge import ([\w, ]+)",
            lambda m: "from knowledge_before import " + m.group(1),
            source,
        )
        for sibling in _SIBLINGS:
            source = source.replace(
                f"from knowledge.{sibling} ", f"from knowledge_before.{sibling} "
            )
        spec = importlib.util.spec_from_loader(f"knowledge_before.{name}", loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__file__ = str(path)
        sys.modules[f"knowledge_before.{name}"] = module
        exec(compile(source, str(path), "exec"), module.__dict__)
        setattr(package, name, module)
    return package.search
