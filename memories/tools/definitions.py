"""The built-in tools: ``manage_memory`` and ``search_memory`` over the engine's core
facts of a scope (LangMem's semantics), ``retrieve_node_memory`` and
``write_node_memory`` over the memory stores attached to a flow's node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from django.contrib.auth.models import User

from core.errors import InvalidInput, NotFound
from core.validation import NODE_ID, SESSION_ID
from memories.conversations.models import Flow
from memories.conversations.selectors import flow_get
from memories.engine.facade import MemoryEngine
from memories.facts.api.serializers import HitSerializer
from memories.facts.models import CATEGORIES, Fact
from memories.facts.scopes import owner_pk
from memories.facts.search import FactHit
from memories.facts.services import MAX_FACT_CHARS
from memories.facts.timeline import at_from
from memories.stores.models import STAGES
from memories.stores.runtime import StoreError, node_memory_retrieve, node_memory_write
from memories.tools.registry import Tool, ToolContext, ToolError, parse_uuid, register

MAX_CONTENT = 10_000  # (a query's text)
SEARCH_HINT = "call search_memory to find the id of the memory you mean"

MANAGE_DESCRIPTION = (
    "Create, update or delete a long-term memory. To remember something new, call with "
    "content (one self-contained fact, e.g. 'User prefers dark mode') and no id. To correct "
    "or refine a memory, call with action 'update', its id and the new full content. To "
    "forget one, call with action 'delete' and its id. Ids come from search_memory. "
    "Answers what it did."
)
SEARCH_DESCRIPTION = (
    "Search the long-term memories of this scope by meaning and keywords; best matches "
    "first, each with its id (for manage_memory), content, category and confidence."
)


# --- manage_memory ------------------------------------------------------------------
def manage_memory(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    action, content, fact_id = args["action"], args.get("content"), args.get("id")
    scope = ctx.filled_scope()
    engine = MemoryEngine(owner=ctx.owner)
    if action == "create":
        if fact_id is not None:
            raise ToolError(
                "id is only for update and delete: to create a memory leave id out; to change "
                f"memory {fact_id} call again with action 'update'",
                code="invalid_arguments",
            )
        if not (content or "").strip():
            raise ToolError(
                "content is required to create a memory: give the fact to remember as one sentence",
                code="invalid_arguments",
            )
        result = engine.manage(
            scope, content, "create", category=args.get("category"),
            reason="manage_memory tool", source_kind="api", source_ref="tool:manage_memory",
        )  # fmt: skip
        kept = result.fact.content if result.fact is not None else None
        replaced = result.decision.target_id if result.decision is not None else None
        return _created(result.action, result.fact_id, content or "", kept, replaced)
    if fact_id is None:
        raise ToolError(
            f"id is required to {action} a memory; {SEARCH_HINT}", code="invalid_arguments"
        )
    parsed = parse_uuid(fact_id, what="id", hint=SEARCH_HINT)
    if action == "update" and not (content or "").strip() and not args.get("category"):
        raise ToolError(
            "content is required to update a memory: give the memory's new full text",
            code="invalid_arguments",
        )
    before = (
        Fact.objects.filter(owner_id=owner_pk(ctx.owner), pk=parsed)
        .values_list("content", "category")
        .first()
    )
    try:
        result = engine.manage(
            scope, content or None, action, parsed, category=args.get("category"),
            reason="manage_memory tool",
        )  # fmt: skip
    except NotFound:
        raise ToolError(
            f"no memory with id {fact_id} in scope {list(scope)}; {SEARCH_HINT}",
            code="memory_not_found",
            status=404,
        ) from None
    if action == "update":
        assert result.fact is not None
        if before == (result.fact.content, result.fact.category):  # (it was told "updated")
            return {
                "action": "unchanged",
                "id": str(parsed),
                "content": result.fact.content,
                "message": f"Memory {parsed} already says this; nothing changed.",
            }
        return {
            "action": "updated",
            "id": str(parsed),
            "content": result.fact.content,
            "message": f"Updated memory {parsed}.",
        }
    return {"action": "deleted", "id": str(parsed), "message": f"Deleted memory {parsed}."}


def _created(
    decision: str,
    fact_id: str | None,
    content: str,
    kept: str | None = None,
    replaced: str | None = None,
) -> dict[str, Any]:
    if decision in ("add", "replace"):
        # (a correction, or the opposite of a memory as near as a duplicate, replaces it)
        instead = f" It replaces memory {replaced}, which said otherwise." if replaced else ""
        return {
            "action": "created",
            "id": fact_id,
            "content": content,
            "message": f"Created memory {fact_id}.{instead}",
            **({"replaced_id": replaced} if replaced else {}),
        }
    if decision == "duplicate":
        # The memory kept, as stored: a fact of the same meaning may say another thing
        # ("User is 30 years old" for "... 31 ..."), and the caller was shown its own text
        # as if stored. Said, with how to change it.
        stored = content if kept is None else kept
        same = stored.strip() == content.strip()
        return {
            "action": "unchanged",
            "id": fact_id,
            "content": stored,
            "message": f"Already remembered as memory {fact_id}; nothing was added."
            if same else f"Already remembered, in other words, as memory {fact_id}: "
            f"{stored!r}; nothing was added. If that is wrong, call again with action "
            f"'update', id {fact_id} and the new content.",
        }  # fmt: skip
    # below_threshold or evicted at once (the scope is full of surer facts)
    return {
        "action": "not_stored",
        "id": None,
        "content": content,
        "message": f"Not stored ({decision.replace('_', ' ')}).",
    }


register(
    Tool(
        name="manage_memory",
        description=MANAGE_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "content": {
                    "type": ["string", "null"],
                    "maxLength": MAX_FACT_CHARS,  # (what a fact may hold: longer is refused)
                    "description": "The memory's text: required to create, the new text to "
                    "update, left out to delete.",
                },
                "action": {
                    "type": "string",
                    "enum": ["create", "update", "delete"],
                    "default": "create",
                    "description": "create (no id), update or delete (with id).",
                },
                "id": {
                    "type": ["string", "null"],
                    "description": "The memory to update or delete (from search_memory).",
                },
                "category": {
                    "type": ["string", "null"],
                    "enum": [*CATEGORIES, None],
                    "description": "Optional kind of memory (default context).",
                },
            },
            "additionalProperties": False,
        },
        run=manage_memory,
    )
)


# --- search_memory ------------------------------------------------------------------
def _hit(hit: FactHit) -> dict[str, Any]:
    """A hit in the shape every door answers (``memories.facts.api.serializers``)."""
    return dict(HitSerializer(hit).data)


def search_memory(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    scope = ctx.filled_scope()
    with _arguments():
        at = at_from(args.get("as_of"), args.get("valid_at"))
    result = MemoryEngine(owner=ctx.owner).search(
        scope, args["query"], limit=args["limit"], offset=args["offset"],
        filter=args.get("filter"), at=at,
    )  # fmt: skip
    return {"mode": result.mode, "results": [_hit(h) for h in result.hits]}


register(
    Tool(
        name="search_memory",
        description=SEARCH_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_CONTENT,
                    "description": "What to look for.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100,
                    "default": 10,
                    "description": "How many memories at most.",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 10_000,
                    "default": 0,
                    "description": "How many of the best matches to skip (paging).",
                },
                "filter": {
                    "type": ["object", "null"],
                    "description": "Optional: category (one or a list) and min_confidence.",
                    "properties": {
                        "category": {
                            "anyOf": [
                                {"type": "string", "enum": list(CATEGORIES)},
                                {
                                    "type": "array",
                                    "items": {"type": "string", "enum": list(CATEGORIES)},
                                    "minItems": 1,
                                },
                            ]
                        },
                        "min_confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                    "additionalProperties": False,
                },
                "as_of": {
                    "type": ["string", "null"],
                    "maxLength": 64,
                    "description": "Optional ISO 8601 time: what was remembered then.",
                },
                "valid_at": {
                    "type": ["string", "null"],
                    "maxLength": 64,
                    "description": "Optional ISO 8601 time: what was true in the world then.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },  # fmt: skip
        run=search_memory,
        read_only=True,
    )
)


# --- the memory stores of a node ----------------------------------------------------
def _flow(ctx: ToolContext, value: str) -> Flow:
    flow_id = parse_uuid(value, what="flow", hint="give the id of one of your flows")
    try:
        return flow_get(owner=cast(User, owner_pk(ctx.owner)), flow_id=flow_id)
    except Flow.DoesNotExist:
        raise ToolError(
            f"no flow with id {value}; give the id of one of your flows",
            code="flow_not_found",
            status=404,
        ) from None


# (the limits of the ids every door takes: REST took 255-character session ids the tools
# refused, and the tools said 200 of node ids, which are 1-128)
NODE_PROPERTIES: dict[str, Any] = {
    "flow": {"type": "string", "description": "The flow's id."},
    "node_id": {"type": "string", "minLength": 1, "maxLength": NODE_ID.max_length,
                "description": "The agent node whose attached memory stores are used."},
    "session_id": {"type": "string", "maxLength": SESSION_ID.max_length, "default": "",
                   "description": "The conversation, for stores that keep sessions apart."},
}  # fmt: skip


@contextmanager
def _arguments() -> Iterator[None]:
    """A service's refusal of an argument answered as every bad argument of a tool is
    (``invalid_arguments``; a bad node id was ``invalid``)."""
    try:
        yield
    except InvalidInput as exc:
        raise ToolError(f"invalid arguments: {exc}", code="invalid_arguments",
                        details=exc.details) from None  # fmt: skip


def retrieve_node_memory(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    flow = _flow(ctx, args["flow"])
    with _arguments():
        result = node_memory_retrieve(
            flow=flow, node_id=args["node_id"], stage=args["stage"], query=args["query"],
            session_id=args["session_id"], max_tokens=args.get("max_tokens"),
        )  # fmt: skip
    return {
        "stage": result.stage,
        "prompt": result.prompt,
        "token_count": result.token_count,
        "truncated": result.truncated,
        "stores": [
            {
                "store": group.store,
                "type": group.type,
                "hits": [
                    {
                        "id": h.id,
                        "item_id": int(h.id) if str(h.id).isdigit() else None,
                        "content": h.content,
                        "score": h.score,
                        "similarity": h.similarity,
                    }
                    for h in group.hits
                ],  # fmt: skip
            }
            for group in result.stores
        ],
        "errors": [_error(e) for e in result.errors],
    }


def _error(error: StoreError) -> dict[str, str]:
    return {"store": error.store, "type": error.type, "code": error.code,
            "message": error.message}  # fmt: skip


def write_node_memory(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    flow = _flow(ctx, args["flow"])
    with _arguments():
        results = node_memory_write(
            flow=flow, node_id=args["node_id"], input=args["input"], output=args["output"],
            session_id=args["session_id"],
        )  # fmt: skip
    return {
        "results": [
            {
                "store": r.store,
                "type": r.type,
                "action": str(r.result.action),
                "item_id": r.result.item_id,
                "reason": r.result.reason,
            }
            for r in results
        ],  # fmt: skip
        "errors": [_error(e) for e in results.errors],
    }


register(
    Tool(
        name="retrieve_node_memory",
        description=(
            "Retrieve the related memories of an agent node of a flow from the memory stores "
            "attached to it, at a stage of its run, as a prompt block and per-store hits."
        ),
        parameters={
            "type": "object",
            "properties": {
                **NODE_PROPERTIES,
                "stage": {"type": "string", "enum": list(STAGES), "default": "pre"},
                "query": {"type": "string", "maxLength": 20_000},
                "max_tokens": {"type": "integer", "minimum": 20, "maximum": 100_000},
            },
            "required": ["flow", "node_id", "query"],
            "additionalProperties": False,
        },
        run=retrieve_node_memory,
        scoped=False,
        read_only=True,
    )
)

register(
    Tool(
        name="write_node_memory",
        description=(
            "Write one turn (the node's input and output) to every memory store an agent node "
            "of a flow writes to; answers per store what it did (added, duplicate, skipped)."
        ),
        parameters={
            "type": "object",
            "properties": {
                **NODE_PROPERTIES,
                "input": {"type": "string", "maxLength": 100_000},
                "output": {"type": "string", "maxLength": 100_000},
            },
            "required": ["flow", "node_id", "input", "output"],
            "additionalProperties": False,
        },
        run=write_node_memory,
        scoped=False,
    )
)
