"""The one write service of facts: add (a batch, each with the exact and the semantic
duplicate check, replacements, the flip-flop guard), update, delete, eviction, sharing,
restore and erasure, each audited. Every door writes through it: the personal memories
API, global memories, the engine's API and facade, the tools and MCP, the chat proxy's
learning (the extraction), the dreams and the admin.

Concurrency: the writes of one scope take the scope's transaction-scoped advisory lock
and re-check duplicates under it, so concurrent writers of one scope leave one fact per
meaning. Every change writes a ``FactChange`` audit row with its reason, evictions
included. Embeddings are computed before the transaction (a provider failure raises
and writes nothing); invalid input raises ``InvalidInput`` before anything is written.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from psycopg.types.json import Jsonb

from core.audit import access_record
from core.db import advisory_xact_lock, advisory_xact_lock_statement
from core.erasure import send_scope_erased
from core.errors import Conflict, InvalidInput
from core.key_limits import scope_check
from core.metrics import counter_add, counters_add
from core.providers.embeddings import Embedder, get_embedder
from core.providers.tokens import count_tokens
from knowledge.retrieval import db
from memories.conversations.erasure import sessions_erase
from memories.conversations.selectors import flow_find, session_ids_with_sender
from memories.facts.models import (
    CATEGORIES,
    SOURCE_KINDS,
    Fact,
    FactChange,
    FactLink,
    FactVersion,
    Scope,
)
from memories.facts.scopes import ScopePath, scope_ensure, scope_find, scope_parse
from memories.facts.search import fact_nearest
from memories.facts.selectors import FactNotFound, fact_resolve

logger = logging.getLogger("memories.decisions")

MAX_FACT_CHARS = 2000


@dataclass
class FactIn:
    """One fact to add. ``replaces``: the id of a fact of the same scope it contradicts
    or refines (decided by the caller, e.g. the extraction LLM); that fact is unlinked
    and the replacement audited with ``reason``."""

    content: str
    category: str = "context"
    confidence: float = 1.0
    source_kind: str = "api"
    source_ref: str = ""
    observed_at: datetime | None = None
    replaces: uuid.UUID | str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    valid_from: datetime | None = None
    valid_to: datetime | None = None


@dataclass
class FactDecision:
    """What ``fact_add`` did with one input, in input order.

    ``action``: ``add``, ``replace`` (``target_id`` unlinked), ``duplicate`` (``fact_id``
    is the existing fact; ``match`` is "exact" or "semantic"), ``below_threshold``
    (nothing written), ``evicted`` (added, then trimmed at once by ``max_facts``),
    ``flip_flop`` (a replacement that would bring back a text the same fact replaced
    within the last ``ENGINE_FLIP_FLOP_WINDOW`` replacements of the scope, without a
    higher confidence: nothing written, ``fact_id`` is the fact kept).
    ``evicted_ids`` on the last decision of a batch lists every fact trimmed.
    """

    content: str
    action: str
    reason: str = ""
    fact_id: str | None = None
    target_id: str | None = None
    match: str | None = None
    similarity: float | None = None
    evicted_ids: list[str] = field(default_factory=list)


# --- Validation -------------------------------------------------------------------------


def normalize_fact(text: str) -> str:
    """Lower-case, NFKC, collapsed whitespace, no trailing punctuation: the exact-dup key."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"\s+", " ", text).strip()
    return text.rstrip(" .!?;:")


def validate_content(content: str) -> str:
    content = (content or "").strip()
    if not content:
        raise InvalidInput("fact content may not be blank", details={"content": "blank"})
    if len(content) > MAX_FACT_CHARS:
        raise InvalidInput(
            f"fact content is longer than {MAX_FACT_CHARS} characters",
            details={"content": f"at most {MAX_FACT_CHARS} characters"},
        )
    return content


def _validate_category(category: str) -> None:
    if category not in CATEGORIES:
        raise InvalidInput(
            f"category must be one of {', '.join(CATEGORIES)}",
            details={"category": f"{category!r} is not a category"},
        )


def _validate_confidence(confidence: Any) -> float:
    if not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise InvalidInput(
            "confidence must be a number from 0 to 1", details={"confidence": confidence}
        )
    return float(confidence)


def validate_validity(valid_from: datetime | None, valid_to: datetime | None) -> None:
    """A fact's time in the world: from 1900 on, and ``valid_from`` before ``valid_to``."""
    for name, value in (("valid_from", valid_from), ("valid_to", valid_to)):
        if value is not None and value.year < 1900:
            raise InvalidInput(f"{name} is before 1900", details={name: "before 1900"})
    if valid_from is not None and valid_to is not None and valid_from >= valid_to:
        raise InvalidInput(
            "valid_from must be before valid_to", details={"valid_to": "not after valid_from"}
        )


def validate_fact(fact: FactIn) -> FactIn:
    fact.content = validate_content(fact.content)
    validate_validity(fact.valid_from, fact.valid_to)
    _validate_category(fact.category)
    fact.confidence = _validate_confidence(fact.confidence)
    if fact.source_kind not in SOURCE_KINDS:
        raise InvalidInput(
            f"source_kind must be one of {', '.join(SOURCE_KINDS)}",
            details={"source_kind": fact.source_kind},
        )
    return fact


def fact_line(fact: Any) -> str:
    """A fact as injection writes it (``memories.facts.injection``); what ``tokens`` counts."""
    return f"- [{fact.category} | {fact.confidence:.2f}] {fact.content}"


# --- Pieces of every write ---------------------------------------------------------------


def _lock_key(scope: Scope) -> str:
    return f"memories:{scope.pk}"


def _lock(scope: Scope) -> None:
    advisory_xact_lock(_lock_key(scope))


def scope_lock(*, scope: Scope) -> None:
    """Hold the lock every write of the scope's facts takes, for the caller's
    transaction (an import closing facts the services may be changing)."""
    _lock(scope)


def scope_hold(*, owner: AbstractBaseUser | int, scope: ScopePath) -> Scope:
    """The scope, made if missing and locked for the caller's transaction against its
    erasure (which takes the same lock): what another room writes for it then cannot
    outlive an erasure running beside it (a summary stored as the scope was erased stayed,
    with no scope left to erase it by)."""
    row = scope_ensure(owner=owner, scope=scope)
    _lock(row)
    if not Scope.objects.filter(pk=row.pk).exists():  # erased while this waited
        row = scope_ensure(owner=owner, scope=scope)
        _lock(row)
    return row


def scope_held_if_there(scope: Scope) -> bool:
    """In the caller's transaction: the scope's lock against its erasure (which takes the
    same lock), and whether the scope is still there: False when it was erased since the
    caller read it, and what the caller meant to write for it must not outlive that."""
    _lock(scope)
    return Scope.objects.filter(pk=scope.pk).exists()


# The scope's fact count and its fact with this normalised text, if any ((owner,
# normalized) index: a handful of rows whatever the scope's size), in one round trip.
_CHECK = (
    "SELECT (SELECT fact_count FROM memories_scope WHERE id = %s), (SELECT f.id FROM "
    "memories_fact f JOIN memories_factlink l ON l.fact_id = f.id AND l.scope_id = %s "
    "WHERE f.owner_id = %s AND f.normalized = %s LIMIT 1)"
)


def _check(scope: Scope, normalized: str, *, lock: bool = False) -> tuple[int, uuid.UUID | None]:
    """(the scope's facts, its fact of this normalised text or None). ``lock``: the
    scope's lock is taken first, in the same round trip (pipelined: the check starts,
    and reads, once the lock is held)."""
    check = db.Statement(_CHECK, [scope.pk, scope.pk, scope.owner_id, normalized])
    if not lock:
        rows, _ = db.fetch_all([check])[0]
    else:
        rows, _ = db.fetch_all([db.Statement(*advisory_xact_lock_statement(_lock_key(scope))),
                                check])[1]  # fmt: skip
    return int(rows[0][0] or 0), rows[0][1]


# A new fact of one scope, its link and its audit row: one statement.
_INSERT = (
    "WITH f AS (INSERT INTO memories_fact (id, owner_id, content, normalized, scope_id, "
    "category, confidence, source_kind, source_ref, embedding, embedding_model, dimensions, "
    "metadata, tokens, observed_at, valid_from, valid_to, recorded_at, created_at, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s,"
    " %s, %s) RETURNING id), "
    "l AS (INSERT INTO memories_factlink (scope_id, fact_id, shared, created_at) "
    "SELECT %s, id, false, %s FROM f) "
    "INSERT INTO memories_factchange (id, scope_id, old_fact_id, new_fact_id, old_content, "
    "new_content, action, reason, created_at) SELECT %s, %s, %s, id, %s, %s, %s, %s, %s FROM f "
    "RETURNING new_fact_id"
)


def _insert(scope: Scope, fact: FactIn, embedding: list[float], model: str, action: str,
            reason: str, old: Fact | None = None, fact_id: uuid.UUID | None = None,
            now: datetime | None = None) -> uuid.UUID:  # fmt: skip
    """``fact`` as a new fact of ``scope`` (its only scope), linked and audited
    (``action``, replacing ``old``): ``_new_fact`` and ``_audit`` in one statement."""
    now = now or timezone.now()
    fact_id = fact_id or uuid.uuid4()
    tokens = count_tokens(fact_line(fact))
    db.fetch(_INSERT, [
        fact_id, scope.owner_id, fact.content, normalize_fact(fact.content), scope.pk,
        fact.category, fact.confidence, fact.source_kind, fact.source_ref,
        db.VectorParam(embedding), model, len(embedding), Jsonb(fact.metadata or {}),
        tokens, fact.observed_at or now, fact.valid_from, fact.valid_to, now, now, now,
        scope.pk, now,
        uuid.uuid4(), scope.pk, old.pk if old is not None else None,
        old.content if old is not None else "", fact.content, action, reason, now,
    ])  # fmt: skip
    return fact_id


def _audit(scope: Scope, action: str, reason: str, *, old: Fact | None = None,
           new: Fact | None = None, new_content: str = "") -> None:  # fmt: skip
    FactChange.objects.create(
        scope=scope, action=action, reason=reason, old_fact=old, new_fact=new,
        old_content=old.content if old is not None else "",
        new_content=new_content or (new.content if new is not None else ""),
    )  # fmt: skip


# A fact's version as it is now, closed by a change (``FactVersion``): one statement
# copying its row (its vector included, never read into Python).
_CLOSE = (
    "INSERT INTO memories_factversion (id, fact_id, owner_id, scope_id, content, category, "
    "confidence, source_kind, source_ref, metadata, embedding, embedding_model, dimensions, "
    "tokens, observed_at, valid_from, valid_to, recorded_from, recorded_to, created_at, "
    "updated_at, successor_id, action, reason, source, superseded) "
    "SELECT %s, f.id, f.owner_id, %s, f.content, f.category, f.confidence, f.source_kind, "
    "f.source_ref, f.metadata, f.embedding, f.embedding_model, f.dimensions, f.tokens, "
    "f.observed_at, f.valid_from, CASE WHEN %s THEN coalesce(f.valid_to, greatest(%s, "
    "f.valid_from)) ELSE f.valid_to "
    "END, least(coalesce(f.recorded_at, f.created_at), %s), %s, f.created_at, f.updated_at, "
    "%s, %s, %s, %s::jsonb, %s FROM memories_fact f WHERE f.id = %s"
)


@dataclass(frozen=True)
class Closing:
    """Why a version closes: ``action`` (replace, update, delete, evict, merge...), the
    ``reason``, the ``source`` of the change (``{"kind": "flush" | "dream" | "api" |
    "admin" | "tool" | ..., "ref": ...}``), the ``successor`` fact, and whether the
    world changed (``superseded``: then the version was true until ``valid_to``)."""

    action: str
    reason: str
    source: dict[str, Any]
    successor: uuid.UUID | str | None = None
    superseded: bool = False
    valid_to: datetime | None = None


def _close(scope: Scope, fact_id: uuid.UUID | str, closing: Closing,
           now: datetime | None = None) -> None:  # fmt: skip
    """Keep the fact's version as it is now, closed at ``now`` by ``closing``."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        cur.execute(_CLOSE, [
            uuid.uuid4(), scope.pk, closing.superseded, closing.valid_to or now, now, now,
            closing.successor, closing.action, closing.reason, json.dumps(closing.source),
            closing.superseded, fact_id,
        ])  # fmt: skip


def _source(source: Mapping[str, Any] | None, default: str = "service") -> dict[str, Any]:
    return dict(source) if source else {"kind": default}


def _new_fact(scope: Scope, content: str, embedding: Sequence[float], model: str,
              **fields: Any) -> Fact:  # fmt: skip
    """A new fact of ``scope``, linked to it (its only scope: ``Fact.scope`` set)."""
    fields.setdefault("observed_at", None)
    fields["observed_at"] = fields["observed_at"] or timezone.now()
    fields.setdefault("recorded_at", timezone.now())
    fact = Fact(
        owner_id=scope.owner_id, content=content, normalized=normalize_fact(content),
        scope=scope, embedding=list(embedding), embedding_model=model,
        dimensions=len(embedding), **fields,
    )  # fmt: skip
    fact.tokens = count_tokens(fact_line(fact))
    fact.save(force_insert=True)
    FactLink.objects.create(scope=scope, fact=fact)
    return fact


def _delete_if_orphan(fact: Fact) -> None:
    if not FactLink.objects.filter(fact=fact).exists():
        Fact.objects.filter(pk=fact.pk).delete()


def _evict(scope: Scope, max_facts: int, reason: str, count: int,
           source: dict[str, Any]) -> list[str]:  # fmt: skip
    """Trim the scope to ``max_facts`` (``count``: its facts now): lowest confidence
    first, then oldest (audited)."""
    excess = count - max_facts
    if excess <= 0:
        return []
    victims = list(
        Fact.objects.filter(owner_id=scope.owner_id, links__scope=scope)
        .defer("embedding")
        .order_by("confidence", "observed_at", "id")[:excess]
    )
    why = f"max_facts {max_facts} reached" + (f" ({reason})" if reason else "")
    for victim in victims:
        _close(scope, victim.pk, Closing("evict", why, source))
        FactLink.objects.filter(scope=scope, fact=victim).delete()
        _audit(scope, FactChange.Action.EVICT, why, old=victim)
        _delete_if_orphan(victim)
    counter_add("memory_evictions_total", len(victims))
    return [str(v.pk) for v in victims]


# --- Add --------------------------------------------------------------------------------


def fact_add(
    *,
    owner: AbstractBaseUser | int,
    scope: ScopePath | Scope,
    facts: Sequence[FactIn],
    reason: str = "",
    min_confidence: float | None = None,
    max_facts: int | None = None,
    dedup_threshold: float | None = None,
    embedder: Embedder | None = None,
    source: Mapping[str, Any] | None = None,
) -> list[FactDecision]:
    """Add a batch of facts to a scope (a path, created on first use, or a row); one
    ``FactDecision`` per input, in order.

    Facts below ``min_confidence`` (``ENGINE_MIN_CONFIDENCE``, 0.7) are not written.
    A fact whose normalised text, or whose meaning (cosine >= ``dedup_threshold``,
    ``MEMORY_DEDUP_THRESHOLD``; above 1: the text only), the scope already holds is a
    duplicate: nothing is written. A fact with ``replaces`` supersedes that fact of the
    scope. Then the scope is trimmed to ``max_facts`` (``ENGINE_MAX_FACTS``, 500) by
    confidence then age. Every write is audited with ``reason``. Embeddings are
    computed before the transaction (one call for the batch). A replaced or evicted
    fact's version is kept (``FactVersion``), its change's ``source`` with it.
    """
    checked = [validate_fact(f) for f in facts]
    threshold = settings.ENGINE_MIN_CONFIDENCE if min_confidence is None else min_confidence
    limit = settings.ENGINE_MAX_FACTS if max_facts is None else max_facts
    dedup = settings.MEMORY_DEDUP_THRESHOLD if dedup_threshold is None else dedup_threshold
    below = [f.confidence < threshold for f in checked]
    target: Scope | None
    if isinstance(scope, Scope):
        target = scope
        scope_check(scope.path)
    elif all(below):  # nothing to write: the path is checked (in reach of the key), not made
        target = scope_find(owner=owner, scope=scope_parse(list(scope)))
    else:
        target = scope_ensure(owner=owner, scope=scope)
    decisions: list[FactDecision | None] = [None] * len(checked)
    pending: list[int] = []
    for i, fact in enumerate(checked):
        if below[i]:
            decisions[i] = FactDecision(
                fact.content, "below_threshold", f"confidence {fact.confidence} < {threshold}"
            )
        elif (
            target is not None  # (None only when every fact is below the threshold)
            and not fact.replaces
            and (found := _check(target, normalize_fact(fact.content))[1]) is not None
        ):  # cheap check first: no embedding needed
            decisions[i] = _duplicate(fact, found, "exact", 1.0)
        else:
            pending.append(i)
    if pending and target is not None:
        embedder = embedder or get_embedder()
        vectors = embedder.embed([checked[i].content for i in pending])
        embeddings = {i: [float(x) for x in vec] for i, vec in zip(pending, vectors, strict=True)}
        with transaction.atomic():
            count = 0
            for n, i in enumerate(pending):  # the lock is taken with the first check
                decisions[i], count = _add_one(
                    target,
                    checked[i],
                    embeddings[i],
                    embedder.model,
                    dedup,
                    reason,
                    n == 0,
                    source,
                )
            evicted = _evict(target, limit, reason, count, _source(source))
        _mark_evicted(decisions, evicted)
    out = [d for d in decisions if d is not None]
    _count(out)  # (after the commit: the counters' rows are shared by every scope)
    return out


_NEGATIONS = frozenset("not no never nor neither none nothing nobody nowhere cannot".split())
# Words a negation brings along ("does not live" for "lives"), left out of the comparison.
_AUXILIARIES = frozenset(
    "do does did is are was were am be has have had any longer anymore".split()
)


def _words(text: str) -> tuple[bool, set[str]]:
    """(whether the text is negated, its other words, crudely stemmed)."""
    words = re.findall(r"[a-z']+", normalize_fact(text).replace("\u2019", "'"))
    negated = any(w in _NEGATIONS or w.endswith("n't") for w in words)
    kept = {w for w in words if w not in _NEGATIONS and w not in _AUXILIARIES
            and not w.endswith("n't")}  # fmt: skip
    return negated, {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in kept}


def contradiction(fact: FactIn, near: str) -> str | None:
    """Why ``fact``, as near in meaning as a duplicate to the scope's fact ``near``, replaces
    it rather than being one: it is a correction, or it says the opposite: one of the two
    is negated and they differ in little else ("User does not live in Lisbon" against
    "User lives in Lisbon", which an embedder places side by side; not "User lives in
    Lisbon" against "User lives in Lisbon and does not own a car", which says more).
    None: a duplicate."""
    if fact.category == "correction":
        return "a correction of a fact this near"
    (new_negated, new_words), (old_negated, old_words) = _words(fact.content), _words(near)
    if new_negated != old_negated and len(new_words ^ old_words) <= 1:
        return "says the opposite of a fact this near"
    return None


def _duplicate(fact: FactIn, found: Any, match: str, similarity: float) -> FactDecision:
    return FactDecision(
        fact.content, "duplicate", f"{match} duplicate", fact_id=str(found), match=match,
        similarity=similarity,
    )  # fmt: skip


def _add_one(scope: Scope, fact: FactIn, embedding: list[float], model: str, dedup: float,
             reason: str, lock: bool,
             source: Mapping[str, Any] | None) -> tuple[FactDecision, int]:  # fmt: skip
    """One fact of a batch, under the scope's lock (``lock``: take it first): its
    decision and the scope's facts after it."""
    count, found = _check(scope, normalize_fact(fact.content), lock=lock)
    old: Fact | None = None
    if fact.replaces:
        old = _replaced(scope, fact.replaces)
        if old is None:
            reason = f"{reason}; the fact to replace is gone, kept as new".lstrip("; ")
    if old is None:
        if found is not None:  # (re-)checked under the lock
            return _duplicate(fact, found, "exact", 1.0), count
        nearest = fact_nearest(scope, embedding, model) if dedup <= 1 else None
        if nearest is None or nearest[1] < dedup:
            new_id = _insert(scope, fact, embedding, model, FactChange.Action.ADD, reason)
            return FactDecision(fact.content, "add", reason, fact_id=str(new_id)), count + 1
        near = _replaced(scope, nearest[0])
        why = None if near is None else contradiction(fact, near.content)
        if near is None or why is None:
            return _duplicate(fact, nearest[0], "semantic", nearest[1]), count
        old, reason = near, f"{reason}; {why} (similarity {nearest[1]:.2f})".lstrip("; ")
    if (undone := _flip_flop(scope, old, fact)) is not None:
        return FactDecision(
            fact.content,
            "flip_flop",
            f"would restore the text replaced by {undone.created_at:%Y-%m-%d %H:%M} "
            f"({undone.reason or 'no reason'}) without a higher confidence "
            f"({fact.confidence} <= {old.confidence}): kept the newer fact",
            fact_id=str(old.pk),
            target_id=str(old.pk),
        ), count
    now, new_id = timezone.now(), uuid.uuid4()
    _close(scope, old.pk, _replacement(fact, reason, source, new_id, now), now)
    FactLink.objects.filter(scope=scope, fact=old).delete()
    _insert(scope, fact, embedding, model, FactChange.Action.REPLACE, reason, old, new_id, now)
    _delete_if_orphan(old)
    decision = FactDecision(fact.content, "replace", reason, fact_id=str(new_id),
                            target_id=str(old.pk))  # fmt: skip
    return decision, count


def _replacement(fact: FactIn, reason: str, source: Mapping[str, Any] | None,
                 successor: uuid.UUID, now: datetime) -> Closing:  # fmt: skip
    """How a replacement closes the fact it replaces. Learned from a conversation (not a
    correction), the world changed: the old version was true until the new one's
    ``valid_from``, or until the user said it."""
    said = _source(source, fact.source_kind)
    if fact.source_ref and "ref" not in said:
        said["ref"] = fact.source_ref
    world = fact.source_kind in ("message", "journal") and fact.category != "correction"
    until = (fact.valid_from or fact.observed_at or now) if world else None
    return Closing("replace", reason, said, successor, world, until)


def _replaced(scope: Scope, fact_id: uuid.UUID | str) -> Fact | None:
    try:
        return (
            Fact.objects.filter(pk=fact_id, links__scope=scope, owner_id=scope.owner_id)
            .defer("embedding")
            .first()
        )
    except (ValueError, TypeError):  # not a fact id at all
        return None


def _flip_flop(scope: Scope, old: Fact, fact: FactIn) -> FactChange | None:
    """The flip-flop guard of replacements (A -> B -> A from noisy extraction).

    Replacing ``old`` (B) with ``fact`` (A) is refused when one of the scope's last
    ``ENGINE_FLIP_FLOP_WINDOW`` replacements (an extraction or a dream each makes a
    few) made B out of the same text A, unless A now comes with a strictly higher
    confidence than B has: the newer fact is kept, and a user who really changed their
    mind back says it with conviction (a stated correction scores higher than the
    noise). Returns that earlier replacement when the guard holds."""
    window = settings.ENGINE_FLIP_FLOP_WINDOW
    if window <= 0 or fact.confidence > old.confidence:
        return None
    wanted = normalize_fact(fact.content)
    recent = FactChange.objects.filter(scope=scope, action=FactChange.Action.REPLACE).order_by(
        "-created_at", "-id"
    )[:window]
    for change in recent:
        if change.new_fact_id == old.pk and normalize_fact(change.old_content) == wanted:
            return change
    return None


def _mark_evicted(decisions: list[FactDecision | None], evicted: list[str]) -> None:
    if not evicted:
        return
    gone = set(evicted)
    last = None
    for decision in decisions:
        if decision is None:
            continue
        last = decision
        if decision.action in ("add", "replace") and decision.fact_id in gone:
            decision.action, decision.reason = "evicted", "added, then trimmed by max_facts"
    if last is not None:
        last.evicted_ids = evicted


COUNTERS = {"add": "memory_additions_total", "replace": "memory_replacements_total",
            "duplicate": "memory_dedup_total", "flip_flop": "memory_flipflop_total"}  # fmt: skip


def _count(decisions: list[FactDecision]) -> None:
    amounts: dict[str, int] = {}
    for decision in decisions:
        if decision.action in COUNTERS:
            name = COUNTERS[decision.action]
            amounts[name] = amounts.get(name, 0) + 1
    counters_add(amounts)


# --- Update, delete, share --------------------------------------------------------------


class DuplicateFact(Conflict):
    """An edit would make a fact say what another fact of its scope says (an add of that
    text is a duplicate, and writes nothing)."""

    code = "duplicate_fact"


def fact_update(
    *,
    owner: AbstractBaseUser | int,
    fact_id: uuid.UUID | str,
    scope: ScopePath | Scope | None = None,
    content: str | None = None,
    category: str | None = None,
    confidence: float | None = None,
    reason: str = "edited",
    embedder: Embedder | None = None,
    source: Mapping[str, Any] | None = None,
    validity: Mapping[str, datetime | None] | None = None,
    refuse_duplicate: bool = False,
) -> Fact:
    """Change a fact's text (re-embedded, outside the transaction), category,
    confidence or time in the world (``validity``: ``valid_from`` and/or ``valid_to``,
    None to clear), audited with ``reason``; the version it was is kept
    (``FactVersion``, closed with ``source``). A fact shared with other scopes is not
    changed under them: this scope gets a new fact instead (copy on write). The fact is
    the owner's, in ``scope`` when given (``fact_resolve``: else 404). An edit that
    changes nothing writes nothing; ``refuse_duplicate`` (the API's doors): a text another
    fact of the scope has is ``DuplicateFact`` (a dream, which merges facts, may)."""
    content = validate_content(content) if content is not None else None
    if category is not None:
        _validate_category(category)
    if confidence is not None:
        confidence = _validate_confidence(confidence)
    fact, row = fact_resolve(owner=owner, fact_id=fact_id, scope=scope)
    validity = dict(validity or {})
    validate_validity(validity.get("valid_from", fact.valid_from),
                      validity.get("valid_to", fact.valid_to))  # fmt: skip
    if content == fact.content:  # (its own text: nothing to embed, a remote call saved)
        content = None
    embedding: list[float] | None = None
    if content is not None:
        embedder = embedder or get_embedder()
        embedding = [float(x) for x in embedder.embed([content])[0]]
    changes: dict[str, Any] = {
        k: v for k, v in (("category", category), ("confidence", confidence)) if v is not None
    }
    changes.update(validity)
    with transaction.atomic():
        _lock(row)
        fact = Fact.objects.get(pk=fact.pk)  # as it is now, under the lock
        old_content = fact.content
        text = content if content is not None else fact.content
        if text == old_content and all(getattr(fact, k) == v for k, v in changes.items()):
            return fact  # an edit that changes nothing: no version, no audit row, no "now"
        if refuse_duplicate and text != old_content:
            found = _check(row, normalize_fact(text))[1]
            if found is not None and found != fact.pk:
                raise DuplicateFact(
                    f"content: another fact of the scope already says this ({found})",
                    details={"content": [f"the text of fact {found}"]},
                )
        now = timezone.now()
        if FactLink.objects.filter(fact=fact).exclude(scope=row).exists():
            new = _copy_for(row, fact, text, embedding, embedder, changes)
            _close(row, fact.pk, Closing("update", reason, _source(source), new.pk), now)
        else:
            _close(row, fact.pk, Closing("update", reason, _source(source), fact.pk), now)
            new = _change(fact, text, embedding, embedder, {**changes, "recorded_at": now})
        FactChange.objects.create(
            scope=row, old_fact=fact, new_fact=new, old_content=old_content, new_content=text,
            action=FactChange.Action.UPDATE, reason=reason,
        )  # fmt: skip
    return new


def _copy_for(scope: Scope, fact: Fact, text: str, embedding: list[float] | None,
              embedder: Embedder | None, changes: dict[str, Any]) -> Fact:  # fmt: skip
    """A shared fact changed for one scope: that scope's own copy, the others keep it."""
    FactLink.objects.filter(scope=scope, fact=fact).delete()
    keep = {"category": fact.category, "confidence": fact.confidence, "metadata": fact.metadata,
            "source_kind": fact.source_kind, "source_ref": fact.source_ref,
            "valid_from": fact.valid_from, "valid_to": fact.valid_to}  # fmt: skip
    vector = embedding if embedding is not None else list(fact.embedding)
    model = (
        embedder.model if embedder is not None and embedding is not None else fact.embedding_model
    )
    return _new_fact(scope, text, vector, model, **{**keep, **changes})


def _change(fact: Fact, text: str, embedding: list[float] | None, embedder: Embedder | None,
            changes: dict[str, Any]) -> Fact:  # fmt: skip
    fields = dict(changes)
    if embedding is not None and embedder is not None:
        fields.update(
            content=text, normalized=normalize_fact(text), embedding=embedding,
            embedding_model=embedder.model, dimensions=len(embedding), observed_at=timezone.now(),
        )  # fmt: skip
    for name, value in fields.items():
        setattr(fact, name, value)
    fields["tokens"] = fact.tokens = count_tokens(fact_line(fact))
    Fact.objects.filter(pk=fact.pk).update(**fields, updated_at=timezone.now())
    fact.refresh_from_db()
    return fact


def fact_delete(
    *,
    owner: AbstractBaseUser | int,
    fact_id: uuid.UUID | str,
    scope: ScopePath | Scope | None = None,
    reason: str = "deleted",
    source: Mapping[str, Any] | None = None,
) -> None:
    """Unlink a fact from its scope (audited, its last version kept as a
    ``FactVersion`` closed with ``source``); the fact goes when no scope links it.
    The fact is the owner's, in ``scope`` when given (``fact_resolve``: else 404)."""
    fact, row = fact_resolve(owner=owner, fact_id=fact_id, scope=scope)
    with transaction.atomic():
        _lock(row)
        if FactLink.objects.filter(scope=row, fact=fact).exists():
            _close(row, fact.pk, Closing("delete", reason, _source(source)))
        removed, _ = FactLink.objects.filter(scope=row, fact=fact).delete()
        if not removed:  # deleted by a request beside this one, under the same lock
            raise FactNotFound("no such fact")
        _audit(row, FactChange.Action.DELETE, reason, old=fact)
        _delete_if_orphan(fact)


def fact_share(*, scope: Scope, fact: Fact, reason: str = "shared") -> None:
    """Share an existing fact with another scope of the same owner (audited)."""
    if fact.owner_id != scope.owner_id:
        raise InvalidInput("unknown fact", details={"fact": str(fact.pk)})
    with transaction.atomic():
        _lock(scope)
        _, created = FactLink.objects.get_or_create(scope=scope, fact=fact)
        if created:
            # Linked to two scopes or more now: found through its links, not its scope.
            Fact.objects.filter(pk=fact.pk).update(scope=None)
            FactLink.objects.filter(fact=fact).update(shared=True)
            _audit(scope, FactChange.Action.ADD, reason, new=fact)


def fact_restore(
    *,
    scope: Scope,
    fact: dict[str, Any],
    embedding: Sequence[float] | None,
    embedder: Embedder | None,
    reason: str,
) -> Fact:
    """Put back one snapshot fact (``selectors.facts_snapshot``: ``{"id", "content",
    "category", "confidence", "source_kind", "source_ref", "observed_at"}``) in
    ``scope`` with the same id, audited with ``reason`` (what undoing a dream needs).

    ``embedding`` is the content's vector, computed by the caller before its
    transaction, or None when the fact's closed version of this text has it
    (``version_vector``): restored through its version. Idempotent: a fact already
    there with these values changes nothing.
    """
    model = embedder.model if embedder is not None else ""
    if embedding is None:
        found_vector = version_vector(scope=scope, fact_id=fact["id"], content=fact["content"])
        if found_vector is None:
            raise InvalidInput("no vector to restore this fact with", details={"id": fact["id"]})
        embedding, model = found_vector
    values = {
        "content": fact["content"], "normalized": normalize_fact(fact["content"]),
        "category": fact["category"], "confidence": fact["confidence"],
        "source_kind": fact.get("source_kind") or "message",
        "source_ref": fact.get("source_ref") or "",
    }  # fmt: skip
    observed_at = parse_datetime(fact.get("observed_at") or "")
    with transaction.atomic():
        _lock(scope)
        found = Fact.objects.filter(pk=fact["id"], owner_id=scope.owner_id).first()
        if found is None:
            kept = {k: v for k, v in values.items() if k not in ("content", "normalized")}
            found = Fact(
                id=fact["id"], owner_id=scope.owner_id, content=fact["content"],
                normalized=values["normalized"], scope=scope, embedding=list(embedding),
                embedding_model=model, dimensions=len(embedding),
                observed_at=observed_at or timezone.now(), recorded_at=timezone.now(), **kept,
            )  # fmt: skip
            found.tokens = count_tokens(fact_line(found))
            found.save(force_insert=True)
        else:
            _put_back(found, values, embedding, model)
        _, linked = FactLink.objects.get_or_create(scope=scope, fact=found)
        if linked or found.content != fact["content"]:
            _audit(scope, FactChange.Action.ADD, reason, new=found, new_content=fact["content"])
    return found


def version_vector(*, scope: Scope, fact_id: str, content: str) -> tuple[list[float], str] | None:
    """The vector and model of the fact's latest closed version in the scope with this
    text, if it has one."""
    version = (
        FactVersion.objects.filter(scope=scope, fact_id=fact_id, content=content)
        .order_by("-recorded_to")
        .only("embedding", "embedding_model")
        .first()
    )
    if version is None:
        return None
    return [float(x) for x in version.embedding], version.embedding_model


def _put_back(found: Fact, values: dict[str, Any], embedding: Sequence[float],
              model: str) -> None:  # fmt: skip
    changed = {k: v for k, v in values.items() if getattr(found, k) != v}
    if "content" in changed:
        changed.update(embedding=list(embedding), embedding_model=model,
                       dimensions=len(embedding))  # fmt: skip
    if changed:
        for name, value in changed.items():
            setattr(found, name, value)
        changed["tokens"] = count_tokens(fact_line(found))
        Fact.objects.filter(pk=found.pk).update(**changed, recorded_at=timezone.now())


# --- Erasure ----------------------------------------------------------------------------


def scope_erase(*, scope: Scope) -> int:
    """Erasure: remove every link of the scope, the facts no other scope links, the
    audit trail, the facts' closed versions and the scope row, and what other rooms keep of the scope
    (``core.erasure.scope_erased``: the engine's pending updates, summaries, journal,
    MEMORY.md and dream diaries), and for an end user the chats the chat proxy recorded
    for them (``CHAT_PROXY_FLOW``), last: the receivers find the chats by their
    messages. One content-free ``erasure`` event stays in the audit trail of access
    (``core.audit``: whoever acts now, their key and address, when; the kind of scope
    and the counts in ``detail``). Returns the number of facts the scope held."""
    scope_check(scope.path)
    with transaction.atomic():
        _lock(scope)
        send_scope_erased(
            sender=Scope, owner_id=scope.owner_id, scope_id=scope.pk, scope=list(scope.path)
        )
        chats = _chats_erase(scope)
        fact_ids = list(FactLink.objects.filter(scope=scope).values_list("fact_id", flat=True))
        FactLink.objects.filter(scope=scope).delete()
        Fact.objects.filter(pk__in=fact_ids).exclude(
            pk__in=FactLink.objects.values("fact_id")
        ).delete()
        changes, _ = FactChange.objects.filter(scope=scope).delete()
        versions, _ = FactVersion.objects.filter(scope=scope).delete()
        kind = "global" if scope.is_global else "user" if scope.external_id else "scope"
        counts = {"facts": len(fact_ids), "versions": versions, "changes": changes,
                  "chats": chats}  # fmt: skip
        access_record(owner_id=scope.owner_id, action="erasure",
                      detail={"scope_kind": kind, "counts": counts})  # fmt: skip
        scope.delete()
    return len(fact_ids)


def _chats_erase(scope: Scope) -> int:
    """The end user's chats through the proxy (their messages, running summaries and
    node memory documents); how many."""
    flow = flow_find(owner_id=scope.owner_id, name=settings.CHAT_PROXY_FLOW)
    if flow is None or not scope.external_id:
        return 0
    chats = session_ids_with_sender(flow=flow, sender=scope.external_id[:100])
    if chats:
        sessions_erase(flow=flow, session_ids=chats)
    return len(chats)
