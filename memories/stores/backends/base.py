"""What every store type implements, and the values passing through it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from core.errors import Conflict
from core.providers.embeddings import Embedder
from memories.stores.embedding import EmbeddingSpec, build_store_embedder
from memories.stores.models import MemoryStore
from memories.stores.text import Snapshot

if TYPE_CHECKING:
    from memories.stores.search import SearchBatch

WriteAction = Literal["added", "duplicate", "skipped"]


class ReadOnlyStore(Conflict):
    code = "read_only"


class EmbeddingMismatch(Conflict):
    code = "embedding_mismatch"


@dataclass
class QueryVectors:
    """The query embedded once per embedder within one retrieve call."""

    text: str
    _cache: dict[tuple[str, str, int, str], np.ndarray] = field(default_factory=dict)

    def for_embedder(self, embedder: Embedder, text: str | None = None) -> np.ndarray:
        text = self.text if text is None else text
        key = (embedder.provider, embedder.model, embedder.dimensions, text)
        if key not in self._cache:
            self._cache[key] = embedder.embed([text])[0]
        return self._cache[key]


@dataclass(frozen=True)
class RetrieveQuery:
    text: str
    top_k: int
    similarity_threshold: float  # -1 disables the cut
    session_id: str
    vectors: QueryVectors
    # The vector searches of the call's stores, run in one round trip (stores add theirs
    # in ``prepare_retrieve``); None: each store searches on its own.
    searches: SearchBatch | None = None


@dataclass
class StoreHit:
    id: str
    content: str
    score: float | None = None  # the store's own ranking score (higher is better)
    similarity: float | None = None  # cosine similarity, when the store has one
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None


@dataclass(frozen=True)
class WriteIn:
    input: Snapshot
    output: Snapshot
    metadata: dict[str, Any]
    session_id: str


@dataclass(frozen=True)
class WriteResult:
    action: WriteAction
    item_id: int | None = None
    reason: str = ""
    trimmed: int = 0


class StoreBackend(ABC):
    """One store's behaviour. ``prepare`` and ``prepare_retrieve`` run outside any
    transaction (network calls: embeddings); ``retrieve`` runs after every store of
    the node has prepared, in no transaction of the call's own (a type that needs one,
    for ``SET LOCAL`` say, opens it); ``update`` inside the write's transaction with the
    store's lock held, so a type can rely on it for exact deduplication and trimming.
    Types keep no state between calls: everything lives in the database."""

    read_only: ClassVar[bool] = False

    def __init__(self, store: MemoryStore, config: dict[str, Any]):
        self.store = store
        self.config = config

    @property
    def embedding_spec(self) -> EmbeddingSpec:
        store = self.store
        return EmbeddingSpec(
            store.embedding_provider or "none", store.embedding_model, store.embedding_dimensions
        )

    def embedder(self) -> Embedder | None:
        embedder = build_store_embedder(self.config.get("embedding"), self.embedding_spec)
        if embedder is not None and embedder.dimensions != self.store.embedding_dimensions:
            raise EmbeddingMismatch(
                f"store {self.store.name!r} holds {self.store.embedding_dimensions}-dimension "
                f"vectors; its embedder makes {embedder.dimensions}",
                details={"store": self.store.name},
            )
        return embedder

    # --- lifecycle hooks, called by the store services inside their transaction ------
    def created(self) -> None:
        """The store row exists (a file store creates its knowledge base here)."""
        return None  # optional hook

    def embedding_changed(self) -> None:
        """The recorded embedding changed on a store without items of its own."""
        return None  # optional hook

    def deleted(self) -> None:
        """The store row (its items and attachments with it) is gone."""
        return None  # optional hook

    # --- runtime ------------------------------------------------------------------------
    def check_load(self) -> None:
        """Raise what ``load`` would raise before it writes anything (an unset ``${VAR}``,
        a dimension mismatch), without network calls. Called on an unsaved copy before a
        store is created or reconfigured through the API or the admin, so that a store
        that cannot load is refused with nothing written. A store with an ``embedding``
        block resolves it (its ``${VAR}``s) and checks its dimension."""
        if self.config.get("embedding"):
            self.embedder()

    def load(self) -> dict[str, Any] | None:
        """Bring derived data up to date (a file store re-indexes changed files)."""
        return None

    def prepare_retrieve(self, query: RetrieveQuery) -> None:
        """Outside any transaction, before ``retrieve``: network work such as embedding
        the query into ``query.vectors`` (``retrieve`` then finds it there), and adding
        the store's vector search to ``query.searches`` (``sql.Nearest``), so that the
        searches of all the node's stores run in one round trip."""
        return None  # optional hook

    @abstractmethod
    def retrieve(self, query: RetrieveQuery) -> list[StoreHit]:
        """The store's hits for ``query``, best first (every type answers reads)."""

    def prepare(self, write: WriteIn) -> Any:
        return None

    def update(self, write: WriteIn, prepared: Any) -> WriteResult:
        raise ReadOnlyStore(f"memory store {self.store.name!r} is read-only")

    def save(self) -> None:
        """Every update is committed when it returns; kept for DevAll's call order."""
        return None

    def item_count(self) -> int | None:
        """Items the store holds when they are not MemoryItem rows (else None)."""
        return None
