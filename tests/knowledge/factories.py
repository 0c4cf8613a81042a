from __future__ import annotations

from typing import Any

from knowledge.models import KnowledgeBase
from knowledge.services import DocumentIn, knowledge_base_create, knowledge_base_ingest


def make_kb(owner, name: str = "notes", **kwargs: Any) -> KnowledgeBase:
    return knowledge_base_create(owner=owner, name=name, **kwargs)


def ingest(kb: KnowledgeBase, *docs: tuple[str, str] | tuple[str, str, dict]) -> None:
    """Documents as the documents API takes them: source columns may be metadata keys."""
    knowledge_base_ingest(
        knowledge_base=kb,
        documents=[
            DocumentIn.from_payload(source_key=d[0], text=d[1], metadata=d[2] if len(d) > 2 else {})
            for d in docs
        ],
    )
