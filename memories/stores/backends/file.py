"""``file``: read-only, a file-backed knowledge base of the store's own.

Indexing is knowledge's (``knowledge_base_index_files``: chunks of 500/50, only files
whose sha256 changed are re-embedded, chunks of deleted files removed); the vector
search over its chunks (``knowledge.selectors.chunk_nearest_sql``) runs in the retrieve
call's one round trip with the other stores' searches. Files are read only below
``MEMORY_STORE_FILE_ROOTS``: a tenant's config must not read the server's files.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from rest_framework import serializers

from core.api.fields import StrictBooleanField, StrictCharField
from core.db import advisory_session_lock
from core.providers.embeddings import EmbeddingConfig
from knowledge.files import KEY_PREFIX, knowledge_base_index_files
from knowledge.models import KnowledgeBase
from knowledge.selectors import chunk_list
from knowledge.services import (
    FILE_CHUNKING,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_delete_chunks,
)
from memories.stores.backends.base import RetrieveQuery, StoreBackend, StoreHit
from memories.stores.embedding import EmbeddingBlock
from memories.stores.registry import StrictConfig
from memories.stores.search import ChunkSearch, run
from memories.stores.text import key_content

IGNORED_INDEX_HELP = "Accepted for DevAll configs and ignored: the index lives in PostgreSQL"


def file_roots() -> list[Path]:
    return [Path(root).expanduser().resolve() for root in settings.MEMORY_STORE_FILE_ROOTS]


def resolve_source(path: str) -> Path:
    """A source path made absolute (relative ones: below the first file root)."""
    roots = file_roots()
    raw = Path(path).expanduser()
    if not raw.is_absolute() and roots:
        raw = roots[0] / raw
    return raw.resolve()


class FileSource(StrictConfig):
    path = StrictCharField(max_length=1000, help_text="A file or directory")
    file_types = serializers.ListField(
        child=StrictCharField(max_length=20),
        required=False,
        default=list,
        help_text='Suffixes to keep, e.g. [".md", ".mdx"]; empty: every file',
    )
    recursive = StrictBooleanField(default=True)
    encoding = StrictCharField(max_length=40, default="utf-8")

    def validate_path(self, value: str) -> str:
        roots = file_roots()
        if not roots:
            raise serializers.ValidationError(
                "file stores are disabled: no MEMORY_STORE_FILE_ROOTS configured"
            )
        resolved = resolve_source(value)
        if not any(resolved.is_relative_to(root) for root in roots):
            raise serializers.ValidationError(
                f"{value!r} is outside the directories file stores may read"
            )
        if not resolved.exists():
            raise serializers.ValidationError(f"{value!r} does not exist")
        return value

    def validate_encoding(self, value: str) -> str:
        try:
            codecs.lookup(value)
        except LookupError:
            raise serializers.ValidationError(f"unknown encoding {value!r}") from None
        return value


class FileConfig(StrictConfig):
    index_path = StrictCharField(
        required=False, allow_blank=True, default="", help_text=IGNORED_INDEX_HELP
    )
    file_sources = FileSource(many=True, allow_empty=False)
    embedding = EmbeddingBlock(
        required=False,
        allow_null=True,
        default=None,
        help_text="Absent: the service's embedding model (recorded at creation)",
    )


def _in_scope(key: str, sources: list[tuple[Path, bool]]) -> bool:
    path = Path(key.removeprefix(KEY_PREFIX))
    for root, recursive in sources:
        if path == root or (recursive and path.is_relative_to(root)) or path.parent == root:
            return True
    return False


class FileStore(StoreBackend):
    read_only = True

    @property
    def knowledge_base(self) -> KnowledgeBase:
        kb = self.store.knowledge_base
        assert kb is not None, "a file store always has its knowledge base"
        return kb

    # --- lifecycle (called by the store services, inside their transaction) ----------
    def created(self) -> None:
        spec = self.embedding_spec
        assert spec.dimensions is not None
        size, overlap = FILE_CHUNKING
        self.store.knowledge_base = knowledge_base_create(
            owner=self.store.owner,
            name=f"memory-store:{self.store.name}",
            description=f"Files of the memory store {self.store.name!r}",
            source_kind=KnowledgeBase.SourceKind.FILES,
            chunk_size=size,
            chunk_overlap=overlap,
            embedding=EmbeddingConfig(spec.provider, spec.model, spec.dimensions),
        )
        self.store.save(update_fields=["knowledge_base", "updated_at"])

    def embedding_changed(self) -> None:
        """Its chunks are derived from the files: start a new index with the new model."""
        old = self.store.knowledge_base
        self.store.knowledge_base = None
        self.store.save(update_fields=["knowledge_base"])
        if old is not None:
            knowledge_base_delete(knowledge_base=old)
        self.created()

    def deleted(self) -> None:
        if self.store.knowledge_base is not None:
            knowledge_base_delete(knowledge_base=self.store.knowledge_base)

    # --- runtime ------------------------------------------------------------------------
    def check_load(self) -> None:
        self.embedder()  # resolves the block's ${VAR}s and checks the dimension

    def load(self) -> dict[str, Any]:
        """Re-index what changed; drop chunks of files no source covers any more."""
        with advisory_session_lock(f"memory-store-load:{self.store.pk}") as taken:
            if not taken:
                return {"busy": True}
            return self._index()

    def _index(self) -> dict[str, Any]:
        kb, embedder, roots = self.knowledge_base, self.embedder(), file_roots()
        totals = dict.fromkeys(
            ("added", "updated", "unchanged", "deleted", "skipped", "chunks_written"), 0
        )
        sources = []
        for source in self.config["file_sources"]:
            path = resolve_source(source["path"])
            sources.append((path, source["recursive"]))
            if not path.exists():
                totals["skipped"] += 1
                continue
            report = knowledge_base_index_files(
                knowledge_base=kb,
                paths=[path],
                suffixes=source["file_types"],
                recursive=source["recursive"],
                encoding=source["encoding"],
                embedder=embedder,
                within=roots,
            )
            for name in totals:
                totals[name] += getattr(report, name)
        keys = set(chunk_list(knowledge_base=kb).order_by().values_list("document_key", flat=True))
        stale = sorted(k for k in keys if not _in_scope(k, sources))
        if stale:
            knowledge_base_delete_chunks(knowledge_base=kb, document_keys=stale)
            totals["deleted"] += len(stale)
        return totals

    def _query_vector(self, query: RetrieveQuery) -> np.ndarray | None:
        text = key_content(query.text, max_chars=500)
        embedder = self.embedder()
        if not text or embedder is None:
            return None
        return query.vectors.for_embedder(embedder, text)

    def _search(self, query: RetrieveQuery) -> ChunkSearch | None:
        vector = self._query_vector(query)
        if vector is None:
            return None
        text = key_content(query.text, max_chars=500)
        threshold = None if query.similarity_threshold <= -1 else query.similarity_threshold
        data = np.asarray(vector, dtype=np.float64).tobytes()
        return ChunkSearch(self.knowledge_base, text, data, query.top_k, threshold)

    def prepare_retrieve(self, query: RetrieveQuery) -> None:
        search = self._search(query)  # the query embedded, outside any transaction
        if search is not None and query.searches is not None:
            query.searches.add(search)

    def retrieve(self, query: RetrieveQuery) -> list[StoreHit]:
        """The chunks best matching the query's key sentences, as a search of the store's
        knowledge base ranks them (hybrid: meaning and keyword, ``knowledge.search``), in
        the call's one round trip."""
        search = self._search(query)
        if search is None:
            return []
        found = query.searches.result(search) if query.searches is not None else run([search])[0]
        return [
            StoreHit(
                id=f"chunk:{hit.chunk_id}",
                content=hit.text,
                score=hit.score,
                similarity=hit.vector_score,
                metadata={
                    "file_path": hit.metadata.get("file_path", ""),
                    "chunk_index": hit.metadata.get("chunk_index"),
                },
            )
            for hit in found
        ]

    def item_count(self) -> int:
        kb = self.store.knowledge_base
        return kb.chunk_count if kb is not None else 0
