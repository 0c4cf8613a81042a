"""Memory formation: extract permanent facts about a user and reconcile them.

For each extracted fact: an exact duplicate (normalised text) or a semantic
duplicate (cosine >= MEMORY_DEDUP_THRESHOLD) is ignored; otherwise the nearest
existing memories go to the LLM, which decides whether the fact contradicts or
refines one of them (replace) or is unrelated (add). A replacement happens only
when the message is strictly newer than the memory it would replace (the
flip-flop guard). Malformed LLM JSON is repaired or retried once, never raised.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from core.providers import json_answer
from core.providers.embeddings import Embedder, get_embedder
from core.providers.errors import ProviderError
from core.providers.llm import ChatLLM, get_llm
from memories.personal.models import EndUser, Vector
from memories.personal.selectors import MemoryHit, memory_search
from memories.personal.services import (
    counter_add,
    end_user_ensure,
    find_duplicate,
    find_exact_duplicate,
    memory_add,
    memory_replace,
    normalize_fact,
)

logger = logging.getLogger("memories.decisions")
MAX_FACTS = 20

EXTRACTION_PROMPT = """You are an expert memory archivist. Your goal is to extract new, permanent facts, preferences, or meaningful details about the user that should be remembered for future conversations.

Input Context:
- Existing Memories: {existing}
- User Message: {message}

Instructions:
1. Analyze the User Message for factual statements about the user's life, work, preferences, or state.
2. Ignore transient information (e.g., "Hello", "How are you?", "Write a poem", "I am testing this").
3. Ignore facts that are already present in "Existing Memories".
4. Extract facts as concise, standalone sentences (e.g., "User is a software engineer using Bun", "User prefers TypeScript").
5. Return a JSON object with a list of strings called 'memories'.
6. If no new information is found, return an empty list.

Answer with the JSON object only: {{"memories": ["..."]}}"""

CONFLICT_PROMPT = """Compare the New Fact to the Existing Memories about the same user.
New: {fact}
Existing:
{candidates}

Identify:
1. Is the New Fact a direct contradiction of one existing memory? (e.g., "I live in NY" vs "I moved to LA")
2. Is the New Fact a more specific version of one existing memory? (e.g., "I like JS" vs "I like TypeScript")
3. Is it unrelated?

If (1) or (2), answer {{"action": "replace", "target_id": "<id of that memory>", "reason": "<why>"}}.
Otherwise answer {{"action": "add", "reason": "<why>"}}.
Answer with the JSON object only."""


@dataclass
class Decision:
    fact: str
    action: str  # add | replace | ignore
    reason: str
    target_id: str | None = None
    memory_id: str | None = None


def parse_json_object(text: str) -> dict[str, Any] | None:
    """Best-effort JSON repair (``core.providers.json_answer``); a bare list is the facts."""
    return json_answer.parse_json_object(text, list_key="memories")


class _Calls:
    """LLM calls and tokens of one formation run (formation cost, for the benchmark)."""

    def __init__(self, llm: ChatLLM, model: str | None):
        self.llm, self.model, self.count, self.tokens = llm, model, 0, 0

    def json(self, messages: list[dict[str, str]], *, what: str) -> dict[str, Any] | None:
        kwargs: dict[str, Any] = {"temperature": 0}
        if self.model:
            kwargs["model"] = self.model
        answer = json_answer.complete_json(
            self.llm, messages, list_key="memories", what=what,
            event="memory_llm_malformed_json", log=logger, **kwargs,
        )  # fmt: skip
        self.count += len(answer.results)
        self.tokens += sum(int(r.usage.get("total_tokens") or 0) for r in answer.results)
        if answer.value is None:
            counter_add("memory_llm_malformed_total")
        return answer.value


def _extract(calls: _Calls, message: str, existing: list[MemoryHit]) -> list[str]:
    listing = json.dumps([h.content for h in existing], ensure_ascii=False)
    parsed = calls.json(
        [
            {
                "role": "system",
                "content": EXTRACTION_PROMPT.format(existing=listing, message=message),
            }
        ],
        what="extraction",
    )
    raw = (parsed or {}).get("memories") or []
    facts, seen = [], set()
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, str) or not item.strip():
            continue
        key = normalize_fact(item)
        if key and key not in seen:
            seen.add(key)
            facts.append(item.strip()[:2000])
    return facts[:MAX_FACTS]


def _conflict(calls: _Calls, fact: str, candidates: list[MemoryHit]) -> tuple[str, str | None, str]:
    listing = "\n".join(f'- id={h.id}: "{h.content}"' for h in candidates)
    parsed = calls.json(
        [{"role": "user", "content": CONFLICT_PROMPT.format(fact=fact, candidates=listing)}],
        what="conflict",
    )
    if not parsed:
        return "add", None, "conflict check answered no usable JSON; kept as new"
    reason = str(parsed.get("reason") or "")
    if parsed.get("action") == "replace":
        target = str(parsed.get("target_id") or "")
        if target in {str(h.id) for h in candidates}:
            return "replace", target, reason or "contradiction or refinement"
        return "add", None, f"replace named unknown memory {target!r}; kept as new"
    return "add", None, reason or "unrelated"


def _decide(
    calls: _Calls, end_user: EndUser, fact: str, message_at: datetime, embedder: Embedder
) -> Decision:
    exact = find_exact_duplicate(end_user=end_user, content=fact)
    if exact is not None:  # no embedding needed
        counter_add("memory_dedup_total")
        return Decision(fact, "ignore", "exact duplicate", target_id=str(exact.pk))
    embedding = [float(x) for x in embedder.embed([fact])[0]]
    dup = find_duplicate(
        end_user=end_user,
        content=fact,
        embedding=embedding,
        embedder=embedder,
        threshold=settings.MEMORY_DEDUP_THRESHOLD,
    )
    if dup is not None:
        counter_add("memory_dedup_total")
        return Decision(fact, "ignore", f"{dup[0]} duplicate", target_id=str(dup[1].pk))
    nearest = memory_search(
        owner_id=end_user.owner_id,
        end_user=end_user,
        vector=embedding,
        embedding_model=embedder.model,
        top_k=settings.MEMORY_CONFLICT_CANDIDATES,
        threshold=settings.MEMORY_CONFLICT_MIN_SIMILARITY,
    )
    action, target_id, reason = (
        ("add", None, "no related memory") if not nearest else _conflict(calls, fact, nearest)
    )
    if action == "replace" and target_id is not None:
        target = Vector.objects.filter(pk=target_id).first()
        if target is not None and not message_at > target.observed_at:
            counter_add("memory_flipflop_total")
            return Decision(
                fact,
                "ignore",
                "flip-flop guard: the stored memory is not older than this message",
                target_id,
            )
        if target is not None:
            new = memory_replace(
                end_user=end_user,
                old=target,
                content=fact,
                reason=reason,
                observed_at=message_at,
                embedding=embedding,
                embedder=embedder,
            )
            if new is not None:
                return Decision(fact, "replace", reason, target_id, str(new.pk))
        reason = "the memory to replace is gone; kept as new"
    vector, duplicate = memory_add(
        end_user=end_user,
        content=fact,
        reason=reason,
        observed_at=message_at,
        embedding=embedding,
        embedder=embedder,
        dedup_threshold=settings.MEMORY_DEDUP_THRESHOLD,
    )
    assert vector is not None  # memory_add returns the stored or the duplicate vector
    if duplicate is not None:  # a parallel run stored it first
        counter_add("memory_dedup_total")
        return Decision(fact, "ignore", f"{duplicate} duplicate (concurrent)", str(vector.pk))
    return Decision(fact, "add", reason, memory_id=str(vector.pk))


def memory_formation_run(
    *,
    owner_id: int,
    external_id: str,
    message: str,
    message_at: datetime,
    llm: ChatLLM | None = None,
    embedder: Embedder | None = None,
) -> list[Decision]:
    """Learn from one user message: extract facts, reconcile, write, audit, log.

    Safe to run twice: a second run finds every fact already stored (duplicates)
    and writes nothing. Provider failures end the run with what was decided so
    far, logged; they are not raised (formation runs in the background).
    """
    end_user = end_user_ensure(owner=owner_id, external_id=external_id)
    embedder = embedder or get_embedder()
    calls = _Calls(
        llm or get_llm(feature="Memory formation"), settings.MEMORY_EXTRACTION_MODEL or None
    )
    decisions: list[Decision] = []
    facts: list[str] = []
    error = None
    try:
        query = [float(x) for x in embedder.embed([message])[0]]
        existing = memory_search(
            owner_id=owner_id,
            end_user=end_user,
            vector=query,
            embedding_model=embedder.model,
            top_k=20,
        )
        facts = _extract(calls, message, existing)
        for fact in facts:
            decisions.append(_decide(calls, end_user, fact, message_at, embedder))
    except ProviderError as exc:
        error = str(exc)
    counter_add("memory_formation_runs_total")
    counter_add("memory_llm_calls_total", calls.count)
    counter_add("memory_llm_tokens_total", calls.tokens)
    record = {
        "event": "memory_decision",
        "user_id": external_id,
        "owner_id": owner_id,
        "input_message_length": len(message),
        "extracted_count": len(facts),
        "llm_calls": calls.count,
        "llm_tokens": calls.tokens,
        "decisions": [{k: v for k, v in asdict(d).items() if v is not None} for d in decisions],
    }
    if error:
        record["error"] = error
    logger.info(json.dumps(record, ensure_ascii=False))
    return decisions
