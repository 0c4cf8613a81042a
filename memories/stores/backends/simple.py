"""``simple``: summarised turns in PostgreSQL, searched with pgvector and reranked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rest_framework import serializers

from core.api.fields import StrictCharField
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
from memories.stores.text import (
    attachment_overview,
    key_content,
    lexical_score,
    summary_hash,
    turn_summary,
    words,
)

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
    max_items = serializers.IntegerField(
        min_value=1, max_value=1_000_000, default=1000, help_text="Oldest items beyond are dropped"
    )
    max_content_length = serializers.IntegerField(
        min_value=50, max_value=4000, default=500, help_text="Summary length cap (characters)"
    )
    min_content_length = serializers.IntegerField(
        min_value=0, max_value=1000, default=20, help_text="Shorter outputs are skipped"
    )
    rerank_weight = serializers.FloatField(
        min_value=0.0,
        max_value=1.0,
        default=0.3,
        help_text="Share of the lexical score (Jaccard + LCS) in the final score",
    )


@dataclass(frozen=True)
class _Prepared:
    summary: str
    digest: str
    vector: np.ndarray | None


class SimpleStore(StoreBackend):
    def _query_vector(self, query: RetrieveQuery) -> tuple[str, np.ndarray | None]:
        embedder = self.embedder()
        text = key_content(query.text, max_chars=self.config["max_content_length"])
        if embedder is None or not text:
            return text, None
        return text, query.vectors.for_embedder(embedder, text)

    def _search(self, query: RetrieveQuery, vector: np.ndarray) -> sql.Nearest:
        cut = None if query.similarity_threshold <= -1 else 1.0 - query.similarity_threshold
        return sql.Nearest.of(
            self.store.pk, vector, query.top_k * 3, cut, self.store.embedding_dimensions
        )

    def prepare_retrieve(self, query: RetrieveQuery) -> None:
        _, vector = self._query_vector(query)
        if vector is not None and query.searches is not None:
            query.searches.add(self._search(query, vector))

    def retrieve(self, query: RetrieveQuery) -> list[StoreHit]:
        text, vector = self._query_vector(query)
        if vector is None:
            # No embedder (or nothing to compare): the newest items, as the seed degrades.
            return sql.newest(self.store.pk, query.top_k)
        search = self._search(query, vector)
        if query.searches is not None:
            candidates = query.searches.result(search)
        else:
            candidates = sql.nearest_many([search])[0]
        weight = self.config["rerank_weight"]
        query_words = words(text)
        for hit in candidates:
            lexical = lexical_score(query_words, words(hit.content))
            hit.score = (1 - weight) * (hit.similarity or 0.0) + weight * lexical
        candidates.sort(key=lambda h: (-(h.score or 0.0), int(h.id)))
        return candidates[: query.top_k]

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
            metadata={
                "input_preview": write.input.text[:200],
                "content_length": len(prepared.summary),
                "attachments": attachment_overview(write.input, write.output),
                **write.metadata,
            },
            session_id=write.session_id,
            embedding=prepared.vector,
            dimensions=None if prepared.vector is None else len(prepared.vector),
        )
        trimmed = sql.trim(self.store.pk, max_items=self.config["max_items"])
        return WriteResult("added", item_id=item.pk, trimmed=trimmed)
