"""``simple``: summarised turns in PostgreSQL, searched by meaning and by keyword."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.api.fields import StrictCharField, StrictFloatField, StrictIntegerField
from memories.stores.backends import sql
from memories.stores.backends.base import (
    EmbeddingMismatch,
    RetrieveQuery,
    StoreBackend,
    StoreHit,
    WriteIn,
    WriteResult,
)
from memories.stores.embedding import EmbeddingBlock
from memories.stores.models import MemoryItem
from memories.stores.registry import StrictConfig
from memories.stores.search import ItemSearch, run
from memories.stores.text import attachment_overview, key_content, summary_hash, turn_summary

IGNORED_PATH_HELP = "Accepted for DevAll configs and ignored: items live in PostgreSQL"


class SimpleConfig(StrictConfig):
    memory_path = StrictCharField(
        required=False, allow_blank=True, default="", help_text=IGNORED_PATH_HELP
    )
    embedding = EmbeddingBlock(
        required=False,
        allow_null=True,
        default=None,
        help_text="Absent: the service's embedding model (recorded at creation)",
    )
    max_items = StrictIntegerField(
        min_value=1, max_value=1_000_000, default=1000, help_text="Oldest items beyond are dropped"
    )
    max_content_length = StrictIntegerField(
        min_value=50, max_value=4000, default=500, help_text="Summary length cap (characters)"
    )
    min_content_length = StrictIntegerField(
        min_value=0, max_value=1000, default=20, help_text="Shorter outputs are skipped"
    )
    rerank_weight = StrictFloatField(
        min_value=0.0,
        max_value=1.0,
        default=0.3,
        help_text="Share of the keyword match (BM25 over the store's items) in the score",
    )


@dataclass(frozen=True)
class _Prepared:
    summary: str
    digest: str
    vector: np.ndarray | None


class SimpleStore(StoreBackend):
    def _search(self, query: RetrieveQuery) -> ItemSearch:
        """The store's items best matching the query: by meaning (when the store embeds)
        and by keyword, fused (``memories.stores.search``); the query's key sentences
        (``key_content``) are what is embedded and matched."""
        embedder = self.embedder()
        text = key_content(query.text, max_chars=self.config["max_content_length"])
        vector = (
            None if embedder is None or not text else query.vectors.for_embedder(embedder, text)
        )
        cut = None if query.similarity_threshold <= -1 else 1.0 - query.similarity_threshold
        return ItemSearch.of(
            self.store, text, vector, query.top_k, cut, self.config["rerank_weight"]
        )  # fmt: skip

    def prepare_retrieve(self, query: RetrieveQuery) -> None:
        if query.searches is not None:
            query.searches.add(self._search(query))

    def retrieve(self, query: RetrieveQuery) -> list[StoreHit]:
        search = self._search(query)
        if query.searches is not None:
            return query.searches.result(search)  # type: ignore[no-any-return]
        return run([search])[0]

    def prepare(self, write: WriteIn) -> WriteResult | _Prepared:
        output = key_content(write.output.text, max_chars=self.config["max_content_length"])
        if not output:
            return WriteResult("skipped", reason="no output text")
        if len(output) < self.config["min_content_length"]:
            return WriteResult(
                "skipped",
                reason=f"output shorter than {self.config['min_content_length']} characters",
            )
        summary = turn_summary(
            write.input.text, write.output.text, max_chars=self.config["max_content_length"]
        )
        digest = summary_hash(summary)
        existing = MemoryItem.objects.filter(store=self.store, summary_hash=digest)
        found = existing.values_list("id", flat=True).first()
        if found is not None:  # no embedding call for a known summary
            return WriteResult("duplicate", item_id=found)
        embedder = self.embedder()
        vector = None if embedder is None else embedder.embed([summary])[0]
        return _Prepared(summary, digest, vector)

    def update(self, write: WriteIn, prepared: Any) -> WriteResult:
        if isinstance(prepared, WriteResult):
            return prepared
        assert isinstance(prepared, _Prepared)
        # The store's lock is held: check-then-insert is exact (the unique constraint
        # stands behind it), and so is the trim.
        found = (
            MemoryItem.objects.filter(store=self.store, summary_hash=prepared.digest)
            .values_list("id", flat=True)
            .first()
        )
        if found is not None:
            return WriteResult("duplicate", item_id=found)
        if prepared.vector is not None and len(prepared.vector) != self.store.embedding_dimensions:
            raise EmbeddingMismatch(
                f"store {self.store.name!r} holds {self.store.embedding_dimensions}-dimension "
                f"vectors; this one has {len(prepared.vector)}"
            )
        item = MemoryItem.objects.create(
            store=self.store,
            content_summary=prepared.summary,
            summary_hash=prepared.digest,
            input_snapshot=write.input.as_dict(),
            output_snapshot=write.output.as_dict(),
            metadata={  # (the caller's keys, then the service's: those it cannot forge)
                **write.metadata,
                "input_preview": write.input.text[:200],
                "content_length": len(prepared.summary),
                "attachments": attachment_overview(write.input, write.output),
            },
            session_id=write.session_id,
            embedding=prepared.vector,
            dimensions=None if prepared.vector is None else len(prepared.vector),
        )
        trimmed = sql.trim(self.store.pk, max_items=self.config["max_items"])
        return WriteResult("added", item_id=item.pk, trimmed=trimmed)
