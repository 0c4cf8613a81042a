"""The two calls around an agent node's run: retrieve before, write after.

``node_memory_retrieve`` asks every attachment that reads at this stage for its
store's hits, in the store's own order (no re-scoring across stores), and renders
the "===== Related Memories =====" block within a token budget.
``node_memory_write`` gives the turn to every attachment that writes: embeddings are
computed first, outside any transaction; then all stores are written in one
transaction holding their rows' locks (in id order, so two writers never deadlock),
which keeps deduplication and trimming exact under concurrent writers.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from core.errors import InvalidInput, NotFound, ServiceError
from core.providers.tokens import count_tokens
from core.validation import validate_node_id, validate_session_id
from memories.conversations.models import Flow
from memories.stores.backends.base import (
    QueryVectors,
    RetrieveQuery,
    StoreHit,
    WriteIn,
    WriteResult,
)
from memories.stores.models import STAGES, MemoryAttachment, MemoryStore
from memories.stores.search import SearchBatch
from memories.stores.selectors import node_attachments
from memories.stores.services import backend_for
from memories.stores.text import snapshot_from

HEADER = "===== Related Memories ====="
FOOTER = "===== End of Memory ====="
QUERY_MAX_CHARS = 20_000


logger = logging.getLogger(__name__)


@dataclass
class StoreHits:
    store: str
    type: str
    hits: list[StoreHit]
    in_prompt: int = 0


@dataclass
class Retrieval:
    stage: str
    stores: list[StoreHits]
    prompt: str
    token_count: int
    max_tokens: int
    truncated: int  # hits left out of the prompt (the budget): a count, as in histories
    errors: list[StoreError] = field(default_factory=list)


@dataclass
class StoreError:
    """A store that could not answer (an unset ``${VAR}``, its embedding endpoint down,
    a dimension mismatch): the node's other stores answered without it."""

    store: str
    type: str
    code: str
    message: str


def _failed(store: MemoryStore, exc: ServiceError) -> StoreError:
    logger.warning("memory store %s of owner %s failed: %s", store.name, store.owner_id, exc)
    return StoreError(store.name, store.type, exc.code, str(exc))


class NodeWrites(list["StoreWrite"]):
    """The results of the stores written, and ``errors``: the stores that failed."""

    errors: list[StoreError]


@dataclass
class StoreWrite:
    store: str
    type: str
    result: WriteResult


@dataclass
class _Budget:
    """Items go into the block best-first across stores, one rank at a time; a store
    whose next item does not fit adds nothing more (its prompt items stay its top)."""

    max_tokens: int
    groups: list[StoreHits]
    chosen: list[list[str]] = field(default_factory=list)
    prompt: str = ""  # the block, rendered by fill()
    token_count: int = 0

    def fill(self) -> None:
        self.chosen = [[] for _ in self.groups]
        if not any(g.hits for g in self.groups):
            return
        used = count_tokens(HEADER) + count_tokens(FOOTER) + 4
        open_ = [bool(g.hits) for g in self.groups]
        depth = max(len(g.hits) for g in self.groups)
        for rank in range(depth):
            for index, group in enumerate(self.groups):
                if not open_[index] or rank >= len(group.hits):
                    continue
                line = _line(rank + 1, group.hits[rank].content)
                cost = count_tokens(line) + 1
                if rank == 0:
                    cost += count_tokens(f"--- {group.store} ---") + 2
                if used + cost > self.max_tokens:
                    open_[index] = False
                    continue
                used += cost
                self.chosen[index].append(group.hits[rank].content)
        # The sum of the parts is an estimate: the rendered text decides.
        while True:
            self.prompt = self.render()
            self.token_count = count_tokens(self.prompt) if self.prompt else 0
            if self.token_count <= self.max_tokens:
                break
            longest = max(range(len(self.chosen)), key=lambda i: len(self.chosen[i]))
            self.chosen[longest].pop()

    def render(self) -> str:
        if not any(self.chosen):
            return ""
        out = [HEADER]
        for group, contents in zip(self.groups, self.chosen):
            if contents:
                out.append(f"\n--- {group.store} ---")
                out += [_line(i, c) for i, c in enumerate(contents, 1)]
        out.append(f"\n{FOOTER}")
        return "\n".join(out)


_SPACE = re.compile(r"\s+")


def _line(rank: int, content: str) -> str:
    return f"{rank}. {_SPACE.sub(' ', content).strip()}"


def _validate_stage(stage: Any) -> str:
    if stage not in STAGES:
        raise InvalidInput(
            f"stage must be one of {', '.join(STAGES)}", details={"stage": [f"{stage!r}"]}
        )
    return str(stage)


def attachments_or_404(flow: Flow, node_id: str) -> list[MemoryAttachment]:
    validate_node_id(node_id)
    attachments = node_attachments(flow_id=flow.pk, node_id=node_id)
    if not attachments:
        raise NotFound(f"node {node_id!r} of flow {flow.name!r} has no memory attachments")
    return attachments


def _reading(attachments: list[MemoryAttachment], stage: str) -> list[MemoryAttachment]:
    return [
        a for a in attachments if a.read and (not a.retrieve_stage or stage in a.retrieve_stage)
    ]


def node_memory_retrieve(
    *,
    flow: Flow,
    node_id: str,
    stage: str,
    query: str,
    session_id: str = "",
    max_tokens: int | None = None,
    attachments: list[MemoryAttachment] | None = None,
) -> Retrieval:
    """The related memories of a node at ``stage`` for ``query``.

    Each attachment with ``read`` whose ``retrieve_stage`` is empty or holds ``stage``
    gives its store's hits (``top_k``, ``similarity_threshold``; -1 disables the cut),
    ranked by the store itself. ``prompt`` holds them grouped by store, within
    ``max_tokens`` (cl100k tokens; default ``MEMORY_STORE_PROMPT_MAX_TOKENS``), best
    first; "" when nothing was found. ``session_id`` is passed to the stores (the
    built-in ones search across sessions). Raises ``NotFound`` for a node without
    attachments, ``InvalidInput`` for a bad stage, node id or session id.
    """
    stage = _validate_stage(stage)
    if session_id:
        validate_session_id(session_id)
    if not isinstance(query, str) or len(query) > QUERY_MAX_CHARS:
        raise InvalidInput(f"query must be a string of at most {QUERY_MAX_CHARS} characters")
    budget = max_tokens or settings.MEMORY_STORE_PROMPT_MAX_TOKENS
    if attachments is None:
        attachments = attachments_or_404(flow, node_id)
    vectors, searches = QueryVectors(query), SearchBatch()
    requests = [
        (
            attachment.store,
            backend_for(attachment.store),
            RetrieveQuery(
                text=query,
                top_k=attachment.top_k,
                similarity_threshold=attachment.similarity_threshold,
                session_id=session_id,
                vectors=vectors,
                searches=searches,
            ),
        )
        for attachment in _reading(attachments, stage)
    ]
    errors: list[StoreError] = []
    ready = []
    for store, backend, request in requests:
        try:  # a store that fails fails alone: the others answer
            backend.prepare_retrieve(request)  # the query embedded, outside any transaction
        except ServiceError as exc:
            errors.append(_failed(store, exc))
            continue
        ready.append((store, backend, request))
    groups = []
    # The searches of all the stores run at once (the first store to read runs the
    # batch, each search in its own implicit transaction on its own connection): no
    # transaction of our own, which would put them all on this one, in turn.
    for store, backend, request in ready:
        try:
            hits = backend.retrieve(request)[: request.top_k]
        except ServiceError as exc:
            errors.append(_failed(store, exc))
            continue
        groups.append(StoreHits(store=store.name, type=store.type, hits=hits))
    filled = _Budget(budget, groups)
    filled.fill()
    for group, chosen in zip(groups, filled.chosen):
        group.in_prompt = len(chosen)
    return Retrieval(
        stage=stage,
        stores=groups,
        prompt=filled.prompt,
        token_count=filled.token_count,
        max_tokens=budget,
        truncated=sum(len(g.hits) for g in groups) - sum(g.in_prompt for g in groups),
        errors=errors,
    )


def node_memory_write(
    *,
    flow: Flow,
    node_id: str,
    input: Any,
    output: Any,
    metadata: dict[str, Any] | None = None,
    session_id: str = "",
    attachments: list[MemoryAttachment] | None = None,
) -> NodeWrites:
    """Write a turn to every store the node writes to; one result per such store:
    ``added`` (with the item id), ``duplicate`` (the summary is stored already) or
    ``skipped`` (with the reason: no output text, too short...).

    ``input``/``output`` are strings or snapshots ``{text, blocks}``. The stores are
    written in one transaction; a store that cannot prepare its write (an unset
    ``${VAR}``, its embedding endpoint down) fails alone: the others are written and
    ``errors`` (of the ``NodeWrites`` returned) names it.
    """
    if session_id:
        validate_session_id(session_id)
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput("metadata must be an object", details={"metadata": ["object"]})
    write = WriteIn(
        input=snapshot_from(input, "input"),
        output=snapshot_from(output, "output"),
        metadata=dict(metadata or {}),
        session_id=session_id,
    )
    if attachments is None:
        attachments = attachments_or_404(flow, node_id)
    errors: list[StoreError] = []
    writers, prepared = [], []
    for store, backend in [(a.store, backend_for(a.store)) for a in attachments if a.write]:
        try:
            prepared.append(backend.prepare(write))  # network: no transaction
        except ServiceError as exc:
            errors.append(_failed(store, exc))
            continue
        writers.append((store, backend))
    with transaction.atomic():
        ids = sorted({store.pk for store, _ in writers})
        locked = {
            s.pk: s
            for s in MemoryStore.objects.select_for_update().filter(pk__in=ids).order_by("pk")
        }
        results = NodeWrites()
        results.errors = errors
        for (store, backend), ready in zip(writers, prepared):
            if store.pk not in locked:
                raise NotFound(f"memory store {store.name!r} was deleted")
            results.append(StoreWrite(store.name, store.type, backend.update(write, ready)))
    return results
