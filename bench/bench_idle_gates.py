"""The idle gates on a scripted day: LLM calls and tokens of memory work with the gates off
and on (issue 29).

    EMBEDDED_DB_NAME=bench_gates .venv/bin/python bench/bench_idle_gates.py [--users 100]

A day of chat through the proxy (POST /v1/chat/completions through the full Django stack,
the upstream a scripted OpenAI-compatible server on 127.0.0.1; django-q2 in sync mode, so
the queued formation runs in the request): each end user has 1 to 4 chats (seeded), each
of 1 to 6 turns, a turn drawn from what people type: statements with something to learn
(about half) and acknowledgements ("ok", "thanks!", "lol", "👍"). After each turn the
user reads the answer longer than the debounce window: the due scopes run with their
clock 31 s ahead (what each scope's schedule does after the 30 s debounce), so every
pause costs an extraction; at the end of the day the daily dream runs (``dreams_daily``).
The scripted upstream reports each call's usage as the tokenizer counts it, so the tokens
are those a real model would bill for these prompts. Counted from the service's own usage
accounting (``core.UsageDay``): extraction and dream calls and tokens, for

- gates off: the settings ``ENGINE_EXTRACTION_GATE = False``, ``ENGINE_DREAM_MIN_CHANGES = 1`` (the
  behaviour before the gates);
- gates on: the defaults (the extraction gate on, 3 changes before a dream).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDING_PROVIDER", "hashing")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_gates")
os.environ["CHAT_THROTTLE_RATE"] = "1000000/minute"  # (one key sends the whole day)

import django  # noqa: E402

django.setup()

from django_q.conf import Conf  # noqa: E402

Conf.SYNC = True  # queued tasks run in the request: every call is counted

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db.models import Sum  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from core.models import UsageDay  # noqa: E402
from core.providers.tokens import count_tokens  # noqa: E402
from core.services import api_key_create  # noqa: E402
from ingestion.updates import updates_run  # noqa: E402
from memories.engine.dreams import dreams_daily  # noqa: E402
from memories.engine.updates import due_scopes  # noqa: E402
from memories.facts.models import Scope  # noqa: E402
from memories.facts.services import scope_erase  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer, Scripted, chat_body  # noqa: E402

# Statements with something to learn, and the fact the scripted extraction reads in each.
STATEMENTS = {
    "I just moved to Lisbon for a new job.": "User lives in Lisbon",
    "I'm learning Portuguese on Duolingo every evening.": "User is learning Portuguese",
    "My daughter starts school in September.": "User's daughter starts school in September",
    "I switched my side project from Python to Rust.": "User writes a side project in Rust",
    "I run 10 km every Sunday morning.": "User runs 10 km on Sundays",
    "I'm allergic to shellfish, so no paella for me.": "User is allergic to shellfish",
    "We adopted a rescue greyhound called Pepper.": "User has a greyhound named Pepper",
    "I work night shifts at the hospital this month.": "User works night shifts this month",
    "My partner and I are planning a trip to Japan in April.": "User plans a trip to Japan",
    "I prefer short answers with code examples.": "User prefers short answers with code",
    "I've been vegetarian for five years now.": "User is vegetarian",
    "Our team uses Jira and GitLab at work.": "User's team uses Jira and GitLab",
    "Can you help me write a cover letter for a data analyst role?": "User applies for data analyst roles",
    "I play bass in a jazz band on Thursdays.": "User plays bass in a jazz band",
    "I'm saving up for an electric bike.": "User is saving for an electric bike",
    "What's a good stretch for lower back pain after cycling?": "User cycles",
}  # fmt: skip
ACKNOWLEDGEMENTS = ["ok", "thanks!", "lol", "👍", "yes please", "cool, thanks", "got it",
                    "ok thanks", "nice", "haha", "sure", "thank you so much"]  # fmt: skip


def usage_of(payload: dict, text: str) -> dict:
    prompt = sum(count_tokens(str(m.get("content") or "")) + 4 for m in payload["messages"])
    completion = count_tokens(text)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def upstream(server: FakeOpenAIServer) -> None:
    def respond(payload: dict) -> Scripted:
        content = "\n".join(str(m.get("content")) for m in payload["messages"])
        if "You maintain the long-term memory" in content:  # the engine's extraction
            found = [{"content": f, "category": "context", "confidence": 0.9}
                     for m, f in STATEMENTS.items() if f"user: {m}" in content]  # fmt: skip
            text = json.dumps({"newFacts": found, "factsToRemove": []})
        elif "deep dream" in content:  # keep every fact as it is
            ids = re.findall(r"^- \[[0-9.]+\] (.*) \(id: ([0-9a-f-]+)\)$", content, re.M)
            text = json.dumps({"facts": [{"id": i, "content": c} for c, i in ids],
                               "diary": "Nothing to merge."})  # fmt: skip
        else:
            text = "Sure, here you go."
        return Scripted(body=chat_body(text, usage=usage_of(payload, text)))

    server.chat_fn = respond


def day(owner, key: str, users: int, seed: int) -> int:
    """The scripted day; returns the user turns sent."""
    rng = random.Random(seed)
    chats = {u: [[rng.choice(list(STATEMENTS)) if rng.random() < 0.5 else rng.choice(ACKNOWLEDGEMENTS)
                  for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 4))]
             for u in range(users)}  # fmt: skip
    client, headers = Client(), {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    turns = 0
    for number in range(max(len(c) for c in chats.values())):
        histories: dict[int, list[dict]] = {u: [] for u in chats}
        for index in range(6):
            for user, theirs in chats.items():
                if number >= len(theirs) or index >= len(theirs[number]):
                    continue
                history = histories[user]
                history.append({"role": "user", "content": theirs[number][index]})
                body = {"model": "fake-model", "user": f"u{user}", "messages": history[-6:]}
                response = client.post("/v1/chat/completions", body,
                                       content_type="application/json", **headers)  # fmt: skip
                assert response.status_code == 200, response.content
                history.append({"role": "assistant", "content": "Sure, here you go."})
                turns += 1
            # The user reads the answer for longer than the debounce window before the
            # next turn: each scope's schedule runs its due flushes.
            clock = timezone.now() + timedelta(seconds=settings.MEMORY_UPDATE_DEBOUNCE_SECONDS + 1)
            for scope_id in due_scopes(now=clock):
                updates_run(scope_id=scope_id, now=clock)
    dreams_daily(now=timezone.now() + timedelta(minutes=1))
    return turns


def counted(owner) -> dict[str, tuple[int, int]]:
    rows = UsageDay.objects.filter(owner=owner, kind__in=("extraction", "dream"))
    out = {}
    for kind in ("extraction", "dream"):
        sums = rows.filter(kind=kind).aggregate(
            c=Sum("calls"), i=Sum("tokens_in"), o=Sum("tokens_out")
        )
        out[kind] = (int(sums["c"] or 0), int(sums["i"] or 0) + int(sums["o"] or 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    logging.getLogger("memories.decisions").setLevel(logging.WARNING)
    server = FakeOpenAIServer().start()
    upstream(server)
    server.serve_as_llm(settings)
    settings.MEMORY_UPDATE_DEBOUNCE_SECONDS = 30
    figures = {}
    for name, gate, changes in (("gates off", False, 1), ("gates on", True, 3)):
        owner, _ = get_user_model().objects.get_or_create(username=f"bench-gates-{name[6:]}")
        for scope in Scope.objects.filter(owner=owner):
            scope_erase(scope=scope)
        UsageDay.objects.filter(owner=owner).delete()
        _, key = api_key_create(owner=owner, name="bench")
        settings.ENGINE_EXTRACTION_GATE, settings.ENGINE_DREAM_MIN_CHANGES = gate, changes
        turns = day(owner, key, args.users, args.seed)
        figures[name] = counted(owner)
        (ec, et), (dc, dt) = figures[name]["extraction"], figures[name]["dream"]
        print(f"{name:9}: {turns} user turns; extraction {ec} calls, {et:,} tokens; "
              f"dreams {dc} calls, {dt:,} tokens; total {ec + dc} calls, {et + dt:,} tokens")  # fmt: skip
    off, on = figures["gates off"], figures["gates on"]
    calls = [sum(v[0] for v in f.values()) for f in (off, on)]
    tokens = [sum(v[1] for v in f.values()) for f in (off, on)]
    print(
        f"saved: {calls[0] - calls[1]} of {calls[0]} calls ({1 - calls[1] / calls[0]:.0%}), "
        f"{tokens[0] - tokens[1]:,} of {tokens[0]:,} tokens ({1 - tokens[1] / tokens[0]:.0%})"
    )
    server.stop()


if __name__ == "__main__":
    main()
