"""Context summaries (the engine's short-term tier): keep the newest messages within a
token budget and fold the older ones into a running summary with the chat LLM.

LangMem's ``summarize_messages`` pattern, with its known bugs beaten:

- the latest human message, and everything after it, is never folded away (#77,
  #111), even when it alone exceeds the budget;
- the running summary is extended, not replaced: the second and later folds send the
  stored summary with an "extend this summary" prompt (#118), and the summary, the
  ids of the messages folded into it and the last one are stored per conversation
  (``ConversationSummary``), so a call only summarises what is new;
- a stored conversation's summary follows its newest thread: a thread uses the stored
  summary only if the messages it folded are the thread's first ones, so after a
  regeneration the old branch, or a later point of the conversation, never leaks in.

Token counts are those of the conversation history (``history.message_cost``). The
running summary enters the answer as one system message in front.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from core.errors import Conflict, InvalidInput
from core.providers.json_answer import MalformedAnswer, read_text
from core.providers.llm import ChatLLM, get_llm
from core.providers.tokens import count_tokens, truncate_to_tokens
from core.usage import usage_for
from core.validation import validate_session_id
from memories.conversations.history import (
    DEFAULT_AI_PREFIX,
    DEFAULT_HUMAN_PREFIX,
    PRIMING_TOKENS,
    History,
    HistoryItem,
    _candidates,
    _link_parent,
    _thread_items,
    _without_pending,
    effective_message_limit,
    extract_thread,
    message_cost,
    pending_answer,
    resolve_message,
)
from memories.conversations.models import ConversationSummary, Flow, Message

logger = logging.getLogger(__name__)
FEATURE = "Context summaries"
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
SUMMARY_TEXT_PREFIX = "System: "  # the summary's line in a history's format=text
MAX_FOLD_ATTEMPTS = 3

FIRST_PROMPT = """Create a summary of the conversation below. Keep the facts, decisions, names, numbers and open questions a reader needs to continue it; leave out greetings and filler. Answer with the summary only.

{conversation}"""

EXTEND_PROMPT = """This is the summary of the conversation so far:
{summary}

Extend this summary by taking into account the new messages of the conversation below. Keep what still matters from the summary; answer with the whole new summary only.

{conversation}"""


class SummaryInputError(InvalidInput):
    code = "invalid"


@dataclass(frozen=True)
class SummaryMessage:
    id: str
    role: str
    content: str

    @property
    def cost(self) -> int:
        return message_cost(self.role, count_tokens(self.content))


@dataclass
class SummaryResult:
    """What the model should see: the running summary (as a system message) and the
    messages kept verbatim; with the stored state and what this call did."""

    summary: str
    summarized_ids: list[str]
    last_summarized_id: str
    kept: list[SummaryMessage]
    folded: list[str] = field(default_factory=list)  # ids folded by this call
    llm_calls: int = 0

    def as_messages(self) -> list[dict[str, str]]:
        head = (
            [{"role": "system", "content": SUMMARY_PREFIX + self.summary}] if self.summary else []
        )
        return head + [{"role": m.role, "content": m.content} for m in self.kept]

    @property
    def token_count(self) -> int:
        messages = self.as_messages()
        if not messages:
            return 0  # nothing to send, as an empty history counts (no reply priming)
        return PRIMING_TOKENS + sum(
            message_cost(m["role"], count_tokens(m["content"])) for m in messages
        )


def validate_budget(
    max_tokens: Any, max_tokens_before_summary: Any, max_summary_tokens: Any
) -> tuple[int, int, int]:
    def whole(name: str, value: Any, low: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            said = f"must be a whole number of at least {low}, not {value!r}"
            raise SummaryInputError(f"{name}: {said}", details={name: said})
        return value

    limit = whole("max_tokens", max_tokens, 16)
    trigger = whole(
        "max_tokens_before_summary",
        limit if max_tokens_before_summary is None else max_tokens_before_summary,
        limit,
    )
    summary = whole("max_summary_tokens", max_summary_tokens, 1)
    if summary >= limit:
        said = f"must be less than max_tokens ({limit}), not {summary} (256 unless given)"
        raise SummaryInputError(f"max_summary_tokens: {said}", details={"max_summary_tokens": said})
    return limit, trigger, summary


def _unsummarised(
    state: ConversationSummary | None, messages: list[SummaryMessage]
) -> list[SummaryMessage]:
    """The messages after the last summarised one (or, when a client dropped it from
    its list, every message not folded yet)."""
    if state is None or not state.last_summarized_id:
        return messages
    ids = [m.id for m in messages]
    if state.last_summarized_id in ids:
        return messages[ids.index(state.last_summarized_id) + 1 :]
    done = set(state.summarized_ids)
    return [m for m in messages if m.id not in done]


def _fits(state: ConversationSummary, messages: list[SummaryMessage]) -> bool:
    """Whether the stored summary belongs to this thread: the messages it folded, the
    last one included, are the thread's first messages, in order (only those still among
    the candidates, when ``message_limit`` cut the thread's start)."""
    ids = [m.id for m in messages]
    folded = list(state.summarized_ids)
    if not folded or not ids:
        return False
    if folded[-1] not in ids:
        # The window (``message_limit``) moved past what was folded: it fits if all of
        # that is older than the window (server ids grow), as it does on a long thread;
        # a summary of later messages (an earlier current message) does not. Whether an
        # old branch's summary lies beyond the window is not read (its parents are not).
        return not set(folded) & set(ids) and _before(folded[-1], ids[0])
    start = ids.index(folded[-1]) + 1
    return start <= len(folded) and ids[:start] == folded[len(folded) - start :]


def _before(folded: str, first: str) -> bool:
    return folded.isascii() and folded.isdigit() and first.isascii() and first.isdigit() and (
        int(folded) < int(first))  # fmt: skip


def _split(fresh: list[SummaryMessage], budget: int) -> int:
    """Index of the first message kept: the newest that fit ``budget``, and always the
    latest human message with everything after it; a tool answer keeps its call."""
    humans = [i for i, m in enumerate(fresh) if m.role == "user"]
    protected = humans[-1] if humans else len(fresh) - 1
    start, used = len(fresh), 0
    for i in range(len(fresh) - 1, -1, -1):
        if i < protected and used + fresh[i].cost > budget:
            break
        used += fresh[i].cost
        start = i
    while 0 < start < len(fresh) and fresh[start].role == "tool":
        start -= 1
    return start


def _transcript(messages: list[SummaryMessage]) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def summary_fold(
    *,
    owner: AbstractBaseUser | int,
    key: str,
    messages: list[SummaryMessage],
    max_tokens: Any,
    max_tokens_before_summary: Any = None,
    max_summary_tokens: Any = 256,
    llm: ChatLLM | None = None,
    with_store: Callable[[], Any] | None = None,
    thread: bool = False,
    store: bool = True,
) -> SummaryResult:
    """Keep the conversation within ``max_tokens``, folding older messages into its
    running summary when it passes ``max_tokens_before_summary`` (default
    ``max_tokens``); see the module docstring for what is kept and how it folds.

    One LLM call at most (none while within budget), made with no transaction open;
    the stored summary advances only if nobody advanced it meanwhile (else the call
    starts again from the new state, so nothing is folded twice). Bad budgets raise
    ``InvalidInput``; a needed fold without an LLM raises ``ProviderNotConfigured``
    (503); a provider error stores nothing. ``with_store`` runs in the transaction that
    stores the summary (a scope's summary makes its scope, which erasure then finds).

    ``thread``: ``messages`` are a stored conversation's whole thread, so the stored
    summary is used only if it fits it (``_fits``); one that does not is replaced by this
    thread's when the call stores, else left as it is. ``store`` false folds without
    storing (a thread other than the conversation's newest).
    """
    limit, trigger, summary_budget = validate_budget(max_tokens, max_tokens_before_summary,
                                                     max_summary_tokens)  # fmt: skip
    owner_id = int(owner if isinstance(owner, int) else owner.pk)
    for _ in range(MAX_FOLD_ATTEMPTS):
        state = ConversationSummary.objects.filter(owner_id=owner_id, key=key).first()
        base = state if state is not None and (not thread or _fits(state, messages)) else None
        fresh = _unsummarised(base, messages)
        result = SummaryResult(
            # (stored by a call with a larger max_summary_tokens, it would break max_tokens)
            summary=truncate_to_tokens(base.text, summary_budget) if base else "",
            summarized_ids=list(base.summarized_ids) if base else [],
            last_summarized_id=base.last_summarized_id if base else "",
            kept=fresh,
        )
        if result.token_count <= trigger:
            return result
        head = message_cost("system", count_tokens(SUMMARY_PREFIX))
        start = _split(fresh, limit - summary_budget - head - PRIMING_TOKENS)
        if start == 0:  # only the protected tail is left: nothing can be folded
            return _within(result, limit)
        to_fold, result.kept = fresh[:start], fresh[start:]
        with usage_for(owner_id=owner_id, kind="summary", subject=_usage_subject(key)):
            # the whole stored summary, to choose from: the new one is cut anyway
            text = _summarise(llm, base.text if base else "", to_fold, summary_budget)
        result.llm_calls = 1
        stored = not store
        if store:
            with transaction.atomic():
                if with_store is not None:
                    with_store()
                stored = _store(owner_id, key, state, state is base, text, to_fold)
                transaction.set_rollback(not stored)
        if stored:
            result.summary = text
            result.folded = [m.id for m in to_fold]
            result.summarized_ids += result.folded
            result.last_summarized_id = to_fold[-1].id
            return _within(result, limit)
    raise SummaryInputError("this conversation's summary keeps changing; try again")


def _within(result: SummaryResult, limit: int) -> SummaryResult:
    """The answer's summary cut to the room the kept messages leave within ``limit``
    (none when they leave none; the stored one stays whole). The summary's prefix and
    overheads came on top of ``max_summary_tokens``, and a protected tail past the split's
    budget took the summary's room: the answer passed ``max_tokens`` though the latest
    human message and what follows it fit."""
    kept = sum(m.cost for m in result.kept)
    room = limit - PRIMING_TOKENS - kept - message_cost("system", count_tokens(SUMMARY_PREFIX))
    while result.summary and result.token_count > limit:
        result.summary = truncate_to_tokens(result.summary, room) if room > 0 else ""
        room -= 1  # (a cut summary may join the prefix's last token differently)
    return result


def summary_messages(summary: str, to_fold: list[SummaryMessage]) -> list[dict[str, str]]:
    """The fold asked of the LLM: a first summary, or the stored one extended."""
    conversation = _transcript(to_fold)
    prompt = (EXTEND_PROMPT.format(summary=summary, conversation=conversation) if summary
              else FIRST_PROMPT.format(conversation=conversation))  # fmt: skip
    return [{"role": "user", "content": prompt}]


def _summarise(
    llm: ChatLLM | None, summary: str, to_fold: list[SummaryMessage], budget: int
) -> str:
    """The new summary text (``read_text``: a ``<think>`` block or a fence around it
    taken off). An empty answer or a refusal raises ``MalformedAnswer`` (502): the
    stored summary stays as it was."""
    answer = (llm or get_llm(feature=FEATURE)).complete(
        summary_messages(summary, to_fold), max_tokens=budget, temperature=0
    )
    reading = read_text(answer.content)
    if reading.malformed:
        logger.warning(json.dumps({"event": "summary_malformed", "reason": reading.reason,
                                   "answer": answer.content[:500]}, ensure_ascii=False))  # fmt: skip
        raise MalformedAnswer("summary", reading.reason, answer.content)
    # The budget holds even for a model that ignores max_tokens.
    return truncate_to_tokens(reading.text, budget)


def _store(owner_id: int, key: str, state: ConversationSummary | None, extends: bool, text: str,
           folded: list[SummaryMessage]) -> bool:  # fmt: skip
    """Advance the stored summary (``extends``), or replace it with another thread's, if
    it is still ``state`` (a conditional update)."""
    ids = [m.id for m in folded]
    values = {"text": text, "last_summarized_id": ids[-1], "token_count": count_tokens(text)}
    if state is None:
        try:
            with transaction.atomic():
                ConversationSummary.objects.create(owner_id=owner_id, key=key, summarized_ids=ids,
                                                   version=1, **values)  # fmt: skip
            return True
        except IntegrityError:  # another call stored the first summary meanwhile
            return False
    return bool(
        ConversationSummary.objects.filter(pk=state.pk, version=state.version).update(
            summarized_ids=[*state.summarized_ids, *ids] if extends else ids,
            version=state.version + 1,
            **values,
        )
    )


def scope_conversation_key(scope: list[str], conversation_id: str) -> str:
    """The summary key of messages a client sends for a conversation of a scope."""
    return f"{scope_key_prefix(scope)}{conversation_id}"


def scope_key_prefix(scope: list[str]) -> str:
    # The JSON array ends with "]": ["org","acme"]'s prefix is no prefix of a longer scope's.
    return f"scope:{json.dumps(list(scope), separators=(',', ':'))}:"


def summary_key_parts(key: str) -> tuple[str, str]:
    """(where, conversation) of a summary key, for people: ``("flow 12", "session-1")``
    or ``("scope org/acme", "c1")``."""
    if key.startswith("scope:["):
        head, _, conversation = key[len("scope:") :].partition("]:")
        try:
            scope = json.loads(head + "]")
        except ValueError:
            return key, ""
        return "scope " + "/".join(str(s) for s in scope), conversation
    if key.startswith("flow:"):
        flow_id, _, session = key[len("flow:") :].partition(":")
        return f"flow {flow_id}", session
    return key, ""


def _usage_subject(key: str) -> str:
    """Whose conversation a summary's LLM call is counted for: ``user/alice`` for a
    scope's, ``flow 12`` for a stored conversation's."""
    where, _ = summary_key_parts(key)
    return where.removeprefix("scope ")


def scope_summaries_delete(*, owner_id: int, scope: list[str]) -> int:
    """Delete the running summaries of every conversation of the scope (erasure)."""
    deleted, _ = ConversationSummary.objects.filter(
        owner_id=owner_id, key__startswith=scope_key_prefix(scope)
    ).delete()
    return deleted


# --- stored conversations -----------------------------------------------------------
def conversation_key(flow: Flow, session_id: str) -> str:
    return f"flow:{flow.pk}:{session_id}"


def sessions_summaries_delete(*, flow: Flow, session_ids: Sequence[str]) -> int:
    """Delete the running summaries of these stored conversations of ``flow`` (erasure)."""
    keys = [conversation_key(flow, session_id) for session_id in session_ids]
    deleted, _ = ConversationSummary.objects.filter(owner_id=flow.owner_id, key__in=keys).delete()
    return deleted


def conversation_thread(
    *, flow: Flow, session_id: str, current_message_id: int | str | None, message_limit: int
) -> list[HistoryItem]:
    """The thread of the current message, oldest first, every message (no budget cut),
    pending answers left out with their questions (as ``conversation_history``)."""
    links = _candidates(flow, session_id, current_message_id, message_limit)
    thread = _without_pending(
        extract_thread(links, key=itemgetter(0), parent=_link_parent, null_parent="linear")
    )
    return list(reversed(list(_thread_items(thread, 1 << 30))))


def session_still_there(flow: Flow, session_id: str, newest: int | None) -> None:
    """In the transaction that stores the summary: the thread's newest message, held
    until the commit. A deletion of the session that committed while the LLM folded (its
    messages first, then its summary: ``sessions_erase``) leaves none, and a summary of
    what it deleted is not stored; one that comes after waits for this commit, then
    deletes the summary too."""
    if newest is None or not (
        Message.objects.select_for_update().filter(flow=flow, session_id=session_id, pk=newest)
        .exists()
    ):  # fmt: skip
        raise Conflict(
            f"Conversation {session_id!r} was deleted while it was being summarised.",
            details={"session_id": session_id},
        )


def _is_newest(flow: Flow, session_id: str, current_message_id: int | str | None) -> bool:
    """Whether the current message is the conversation's newest (its thread is the one the
    stored summary follows)."""
    if current_message_id is None:
        return True
    messages = Message.objects.filter(flow=flow, session_id=session_id)
    current = resolve_message(messages, current_message_id)
    # (a pending answer, stored before the history is asked for, is no thread's message)
    newest = (messages.annotate(pending=pending_answer()).filter(pending=False)
              .order_by("-created_at", "-id").values_list("pk", flat=True).first())  # fmt: skip
    return current is not None and current.pk == newest


@dataclass(frozen=True)
class SummarizedHistory(History):
    """A conversation history whose older messages are folded into ``summary``."""

    summary: SummaryResult | None = None

    def as_messages(self) -> list[dict[str, Any]]:
        head: list[dict[str, Any]] = []
        if self.summary is not None and self.summary.summary:
            head = [{"role": "system", "content": SUMMARY_PREFIX + self.summary.summary}]
        return head + super().as_messages()

    def as_text(
        self, *, human_prefix: str = DEFAULT_HUMAN_PREFIX, ai_prefix: str = DEFAULT_AI_PREFIX
    ) -> str:
        """The transcript after the summary, which it leads as a ``System:`` line (the
        transcript leaves system messages out, but without it the folded messages would
        be in neither; ``token_count`` counts it)."""
        text = super().as_text(human_prefix=human_prefix, ai_prefix=ai_prefix)
        if self.summary is None or not self.summary.summary:
            return text
        head = f"{SUMMARY_TEXT_PREFIX}{SUMMARY_PREFIX}{self.summary.summary}"
        return f"{head}\n{text}" if text else head


def conversation_history_summarized(
    *,
    flow: Flow,
    session_id: str,
    current_message_id: int | str | None = None,
    max_tokens: int,
    message_limit: int | None,
    max_tokens_before_summary: int | None = None,
    max_summary_tokens: int = 256,
    llm: ChatLLM | None = None,
) -> SummarizedHistory:
    """The conversation's thread with its older messages folded into the conversation's
    running summary (``summary_fold``; the same summary ``POST /api/v1/engine/summaries``
    keeps for this conversation). ``flow`` must come from an owner-scoped lookup.

    The stored summary follows the newest thread: a call for it extends the summary (or
    replaces one that does not fit it, after a regeneration); a call for an earlier
    ``current_message_id`` uses the stored summary only if it fits that thread, and what
    it folds is not stored."""
    validate_session_id(session_id)
    limit = effective_message_limit(message_limit)
    items = conversation_thread(flow=flow, session_id=session_id,
                                current_message_id=current_message_id, message_limit=limit)  # fmt: skip
    # Summaries remember server ids (a caller's message_id is optional).
    result = summary_fold(
        owner=flow.owner_id, key=conversation_key(flow, session_id),
        messages=[SummaryMessage(str(i.id), i.role, i.text_content()) for i in items],
        max_tokens=max_tokens, max_tokens_before_summary=max_tokens_before_summary,
        max_summary_tokens=max_summary_tokens, llm=llm, thread=True,
        store=_is_newest(flow, session_id, current_message_id),
        with_store=partial(session_still_there, flow, session_id, items[-1].id if items else None),
    )  # fmt: skip
    kept = {m.id for m in result.kept}
    return SummarizedHistory(
        items=[i for i in items if str(i.id) in kept], token_count=result.token_count,
        max_tokens=max_tokens, thread_length=len(items), message_limit=limit, summary=result,
    )  # fmt: skip
