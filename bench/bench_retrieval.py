"""Retrieval quality on LoCoMo: turn recall of knowledge search, fact recall of personal memory.

Run from the repository root, against a private database:

    EMBEDDED_DB_NAME=bench_retrieval .venv/bin/python bench/bench_retrieval.py \\
        [--data ../shared/data/locomo-dev/locomo-dev.json] [--mode hybrid] [--http] [--facts]

(``EMBEDDED_DB_NAME`` defaults to ``bench_retrieval`` here; the embedder is the configured
one, the local MiniLM by default, and no LLM is used.) The measurement is the one
``locomo-dev/README.md`` defines:

* each conversation is one knowledge base; each turn of every ``session_N`` one document
  ``"<speaker>: <text>"`` with its ``dia_id`` as ``source_key`` and in metadata (one batch
  per conversation, sessions in order), stored as a chat stores it (``--protocol
  sessions``, the default): ``session_id`` ``<sample>/session_N``, timestamp the session's
  date plus N seconds for turn N; ``--protocol documents``: no session, no date;
  ``--protocol senders``: as ``sessions``, but the text without its ``"<speaker>: "``, the
  speaker its ``sender`` (as a memory base stores a chat's messages). Bases are
  reused while their documents and embedder are the same (the name carries a
  fingerprint); ``--fresh`` rebuilds them;
* questions: every ``qa`` entry but category 5, evidence ids normalised (``"D8:6; D9:17"``
  is two ids, ``"D:11:26"`` is ``D11:26``, ``"D30:05"`` is ``D30:5``), ids matching no turn
  dropped, questions left without evidence skipped;
* recall@k of a question = |evidence ids among the top k hits| / |evidence ids|, averaged
  (k 5, 10, 20: the search asks for 20), with Hit@k (an evidence turn among the first k)
  and NDCG@10; printed overall, per category (1 multi-hop, 2 temporal, 3 open-domain,
  4 single-hop) and per conversation, with the search's p50/p95 latency.

``--stores`` adds node memory: each conversation one ``simple`` memory store of its turns
(item text ``"<speaker>: <text>"``, the configured embedder), each question through the
store's search (``memories.stores.search``, top_k 10): turn recall@5 and @10.
``--documents`` adds the hand-written document base (``bench/data/document_base_dev.json``:
ordinary documents, no sessions), ``--personal`` runs only the hand-written personal-facts
set through the chat proxy's preparation (``bench/data/personal_facts_dev.json``).

Searches go through ``knowledge.search.search_chunks`` in process, or with ``--http``
through ``POST /api/v1/knowledge-bases/{id}/search`` of an instance this script serves on
127.0.0.1 (``manage.py serve --no-worker``, same database). ``--mode`` and ``--rrf-k``
are the API's own parameters; ``--set NAME=VALUE`` changes a ranking constant in process,
for tuning: a collection's option (``chunks.vector_weight=0.5``, ``facts.exact_max=10``)
or a constant of the retrieval package (``hnsw.EF_SEARCH=40``, ``bm25.B=0.5``); not
with ``--http``.

``--facts`` adds the personal-memory yardstick: every session's ``observation`` facts are
stored (``memories.facts.services.fact_add``, as given) as personal memories of end users named after
the speakers (one owner per conversation), with their turn ids in metadata. Each question
is then asked as the chat proxy asks it (``memories.proxy.chat.chat_prepare``: the one
search of facts, relevant at MEMORY_SCORE_THRESHOLD or a query word, then its token budget), as each
speaker the question names (both when it names neither or both). Printed: fact recall@k
(share of the evidence turns covered by the top-k facts, no threshold), the share of
questions with at least one evidence fact injected, and the mean number of facts injected.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_retrieval")

import django  # noqa: E402

django.setup()

import bench_db  # noqa: E402

bench_db.as_operator(__file__)

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.search import SearchRequest, search_chunks  # noqa: E402
from knowledge.services import (  # noqa: E402
    DocumentIn,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_ingest,
)

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev" / "locomo-dev.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (5, 10, 20)
HIT_KS = (1, 5, 10)


@dataclass
class Question:
    conversation: str
    text: str
    category: int
    evidence: set[str]


@dataclass
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    documents: list[DocumentIn]
    questions: list[Question]
    facts: list[tuple[str, str, set[str]]] = field(default_factory=list)  # speaker, fact, ids


def normalise_ids(raw: Any, turns: set[str]) -> set[str]:
    """Evidence ids as the README defines them; ids matching no turn are dropped."""
    values = raw if isinstance(raw, list) else [raw]
    out = set()
    for value in values:
        for part in re.split(r";", str(value)):
            numbers = re.findall(r"\d+", part)
            if len(numbers) != 2 or "D" not in part.upper():
                continue
            dia = f"D{int(numbers[0])}:{int(numbers[1])}"
            if dia in turns:
                out.add(dia)
    return out


def session_date(raw: str) -> str:
    """LoCoMo's "1:56 pm on 8 May, 2023" as "8 May 2023" (the day, as a person writes it)."""
    day = raw.split(" on ", 1)[-1].replace(",", "")
    return " ".join(day.split())


def session_time(raw: str, turn: str) -> datetime:
    """A turn's time under the README's protocol: its session's "1:56 pm on 8 May, 2023"
    (UTC) plus N seconds for the N-th turn (``D3:5``: 5 s)."""
    start = datetime.strptime(" ".join(raw.split()), "%I:%M %p on %d %B, %Y")
    return start.replace(tzinfo=UTC) + timedelta(seconds=int(turn.split(":")[1]))


def load(
    path: Path, only: list[str] | None, dates: str = "none", protocol: str = "sessions"
) -> list[Conversation]:
    out = []
    for sample in json.loads(path.read_text()):
        if only and sample["sample_id"] not in only:
            continue
        conv = sample["conversation"]
        sessions = sorted(
            (int(m.group(1)), key)
            for key in conv
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conv[key], list)
        )
        documents = []
        for _, key in sessions:
            # --dates text: the session's date leads each turn's text, as a user of the API
            # who wants dates searchable would write it ("[8 May 2023] Caroline: ...").
            date = session_date(conv.get(f"{key}_date_time", "")) if dates == "text" else ""
            raw_date = conv.get(f"{key}_date_time", "")
            for turn in conv[key]:
                # --protocol sessions: stored as a chat stores its turns (the README's
                # measurement); documents: each turn a document of its own, no session.
                chat = protocol in ("sessions", "senders")
                said = (
                    turn["text"] if protocol == "senders" else f"{turn['speaker']}: {turn['text']}"
                )
                documents.append(
                    DocumentIn(
                        text=(f"[{date}] " if date else "") + said,
                        sender=turn["speaker"] if protocol == "senders" else "",
                        source_key=turn["dia_id"],
                        metadata={"dia_id": turn["dia_id"]},
                        session_id=f"{sample['sample_id']}/{key}" if chat else "",
                        timestamp=session_time(raw_date, turn["dia_id"]) if chat else None,
                    )
                )
        turns = {d.source_key for d in documents}
        questions = []
        for qa in sample["qa"]:
            if qa.get("category") == 5:
                continue
            evidence = normalise_ids(qa.get("evidence") or [], turns)
            if evidence:
                questions.append(
                    Question(sample["sample_id"], qa["question"], qa["category"], evidence)
                )
        facts = []
        for session in sample.get("observation", {}).values():
            for speaker, items in session.items():
                for fact, ids in items:
                    facts.append((speaker, fact, normalise_ids(ids, turns)))
        out.append(
            Conversation(
                sample["sample_id"],
                (conv["speaker_a"], conv["speaker_b"]),
                documents,
                questions,
                facts,
            )
        )
    return out


# --- knowledge bases -------------------------------------------------------------------
def bench_owner(name: str) -> Any:
    user, _ = get_user_model().objects.get_or_create(username=name)
    return user


class Precomputed:
    """An embedder answering from an .npz of vectors computed elsewhere (``--vectors``:
    another model, run in its own virtualenv): ``passage_texts``/``passage_vectors`` for
    the turns, ``query_texts``/``query_vectors`` for the questions (searched with
    ``vector``, as an API client with its own embedder would)."""

    provider = "precomputed"

    def __init__(self, path: Path):
        import numpy as np

        data = np.load(path, allow_pickle=True)
        self.model = path.stem
        # keyed by the text with its whitespace collapsed (chunking strips a turn's ends)
        self.passages = {
            " ".join(t.split()): v
            for t, v in zip(data["passage_texts"], data["passage_vectors"], strict=True)
        }
        self.queries = dict(zip(data["query_texts"], data["query_vectors"], strict=True))
        self.dimensions = int(data["passage_vectors"].shape[1])

    def embed(self, texts: Any) -> Any:
        import numpy as np

        return np.asarray([self.passages[" ".join(t.split())] for t in texts], dtype=np.float32)


PRECOMPUTED: Precomputed | None = None


def _embedding_fields() -> dict[str, Any]:
    from core.providers.embeddings import EmbeddingConfig

    if PRECOMPUTED is not None:
        return {
            "embedding_provider": PRECOMPUTED.provider,
            "embedding_model": PRECOMPUTED.model,
            "embedding_dimensions": PRECOMPUTED.dimensions,
        }
    config = EmbeddingConfig.from_settings()
    return {
        "embedding_provider": config.provider,
        "embedding_model": config.model,
        "embedding_dimensions": config.dimensions,
    }


NO_STOP_CONFIG = "english_nostop"


def _ensure_no_stop_config() -> None:
    """English stemming without the stop-word list (``--language english_nostop``): the
    bench database's own text-search configuration."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = %s", [NO_STOP_CONFIG])
        if cur.fetchone():
            return
        cur.execute(
            "CREATE TEXT SEARCH DICTIONARY english_stem_nostop "
            "(TEMPLATE = snowball, Language = english)"
        )
        cur.execute(f"CREATE TEXT SEARCH CONFIGURATION {NO_STOP_CONFIG} (COPY = english)")
        cur.execute(
            f"ALTER TEXT SEARCH CONFIGURATION {NO_STOP_CONFIG} ALTER MAPPING FOR asciiword, "
            "asciihword, hword_asciipart, word, hword, hword_part WITH english_stem_nostop"
        )


def ensure_base(
    owner: Any, conv: Conversation, fresh: bool, language: str = "english"
) -> KnowledgeBase:
    documents = [
        (d.text, d.source_key, d.session_id, str(d.timestamp))
        + ((d.sender,) if d.sender else ())  # (a fingerprint unchanged for the others)
        for d in conv.documents
    ]
    text = repr((sorted(_embedding_fields().items()), documents))
    if language != "english":
        text += language
    name = f"locomo-{conv.sample_id}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    existing = KnowledgeBase.objects.filter(owner=owner, name=name).first()
    if existing is not None and (fresh or existing.chunk_count != len(conv.documents)):
        knowledge_base_delete(knowledge_base=existing)
        existing = None
    if existing is not None:
        return existing
    if language == NO_STOP_CONFIG:  # not one of the API's languages: set behind its back
        _ensure_no_stop_config()
        kb = knowledge_base_create(owner=owner, name=name)
        KnowledgeBase.objects.filter(pk=kb.pk).update(language=language)
        kb.refresh_from_db()
    else:
        kb = knowledge_base_create(owner=owner, name=name, language=language)
    if PRECOMPUTED is not None:
        KnowledgeBase.objects.filter(pk=kb.pk).update(**_embedding_fields())
        kb.refresh_from_db()
    started = time.perf_counter()
    knowledge_base_ingest(knowledge_base=kb, documents=conv.documents, embedder=PRECOMPUTED)
    print(
        f"ingested {conv.sample_id}: {len(conv.documents)} turns in "
        f"{time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return kb


# --- searching ---------------------------------------------------------------------------
# --question-words (a prototype, measured, not in the product): words of questions that
# the English stop list keeps, taken out of the keyword leg's query only.
QUESTION_WORDS = {"would", "could", "might", "may", "likely", "kind", "type", "whose"}


def strip_question_words(text: str) -> str:
    return " ".join(w for w in re.findall(r"[\w'-]+", text) if w.lower() not in QUESTION_WORDS)


def patch_keyword_query() -> None:
    """The keyword leg sees the query without ``QUESTION_WORDS``; the vector leg embeds it
    whole."""
    from knowledge.retrieval import bm25

    leg = bm25.chunk_leg

    def chunk_leg(kb_ids: Any, language: str, text: str, *rest: Any, **options: Any) -> Any:
        return leg(kb_ids, language, strip_question_words(text), *rest, **options)

    bm25.chunk_leg = chunk_leg  # type: ignore[assignment]


def cache_rewrites(path: Path) -> None:
    """``--rewrite-cache``: the LLM's rewritten queries (or its failure) per question, kept
    in ``path`` and reused, so fusion settings can be compared on the same rewrites."""
    from knowledge import rewrite

    cache = json.loads(path.read_text()) if path.exists() else {}
    ask = rewrite.rewrite_queries

    def rewrite_queries(query: str, *, llm: Any) -> tuple[list[str], str]:
        if query not in cache:
            try:
                cache[query] = list(ask(query, llm=llm))
            except Exception as exc:  # kept as the failure it was
                cache[query] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            path.write_text(json.dumps(cache, indent=1, ensure_ascii=False))
        if isinstance(cache[query], dict):
            raise ValueError(cache[query]["error"])
        queries, model = cache[query]
        return queries, model

    rewrite.rewrite_queries = rewrite_queries  # type: ignore[assignment]


class InProcess:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rewrites: list[Any] = []

    def search(self, kb: KnowledgeBase, query: str, top_k: int, key: str = "dia_id") -> list[str]:
        vector = None if PRECOMPUTED is None else PRECOMPUTED.queries[query]
        request = SearchRequest(
            query=query, vector=vector, top_k=top_k, mode=self.args.mode, rrf_k=self.args.rrf_k
        )
        if self.args.rewrite:
            from knowledge.rewrite import search_rewritten

            found = search_rewritten(bases=[kb], request=request)
            self.rewrites.append(found)
            hits = found.hits
        else:
            hits = search_chunks(bases=[kb], request=request)
        return [h.metadata.get(key, "") for h in hits]

    def close(self) -> None:
        pass


class OverHTTP:
    """A served instance on 127.0.0.1 (its own process, the same database)."""

    def __init__(self, args: argparse.Namespace, owner: Any):
        from core.services import api_key_create

        _, self.key = api_key_create(owner=owner, name="bench_retrieval")
        self.args = args
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = dict(os.environ)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "serve",
                "--no-worker",
                "--port",
                str(self.port),
                "--web-workers",
                "1",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise SystemExit("the served instance did not answer /healthz within 90 s")

    def search(self, kb: KnowledgeBase, query: str, top_k: int) -> list[str]:
        body: dict[str, Any] = {"query": query, "top_k": top_k}
        if self.args.mode_given:
            body["mode"] = self.args.mode
        if self.args.rrf_k is not None:
            body["rrf_k"] = self.args.rrf_k
        if self.args.rewrite:
            body["rewrite"] = True
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v1/knowledge-bases/{kb.pk}/search",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            results = json.loads(response.read())["results"]
        return [r["metadata"].get("dia_id", "") for r in results]

    rewrites: list[Any] = []

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- reporting ---------------------------------------------------------------------------
def recall(found: list[str], evidence: set[str], k: int) -> float:
    return len(evidence & set(found[:k])) / len(evidence)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measures(found: list[str], evidence: set[str]) -> dict[str, float]:
    """Recall@k, Hit@k (an evidence turn among the first k) and NDCG@10 (binary gains)
    of one question's ranked turns."""
    out: dict[str, float] = {f"R@{k}": recall(found, evidence, k) for k in KS}
    out |= {f"Hit@{k}": float(bool(evidence & set(found[:k]))) for k in HIT_KS}
    gain = sum(1 / math.log2(i + 2) for i, turn in enumerate(found[:10]) if turn in evidence)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(evidence), 10)))
    out["NDCG@10"] = gain / ideal
    return out


def report(title: str, rows: list[tuple[Question, dict[Any, float]]]) -> None:
    groups: dict[str, list[dict[Any, float]]] = defaultdict(list)
    for question, scores in rows:
        groups["all"].append(scores)
        groups[f"{question.category} {CATEGORIES[question.category]}"].append(scores)
        groups[question.conversation].append(scores)
    columns = list(rows[0][1])
    print(f"\n{title}")
    names = [c if isinstance(c, str) else f"R@{c}" for c in columns]
    print(f"  {'':16} {'n':>5} " + " ".join(f"{n:>7}" for n in names))
    order = [
        "all",
        *sorted(k for k in groups if k[0].isdigit()),
        *sorted(k for k in groups if k.startswith("conv")),
    ]
    for name in order:
        values = groups[name]
        cells = " ".join(f"{statistics.fmean(v[k] for v in values):7.3f}" for k in columns)
        print(f"  {name:16} {len(values):5d} {cells}")


def run_turns(args: argparse.Namespace, convs: list[Conversation]) -> None:
    owner = bench_owner("bench-retrieval")
    bases = {conv.sample_id: ensure_base(owner, conv, args.fresh, args.language) for conv in convs}
    searcher: InProcess | OverHTTP = OverHTTP(args, owner) if args.http else InProcess(args)
    rows, latencies = [], []
    try:
        for conv in convs:  # warm-up: the embedder, connections
            searcher.search(bases[conv.sample_id], conv.questions[0].text, max(KS))
        for conv in convs:
            for question in conv.questions:
                started = time.perf_counter()
                found = searcher.search(bases[conv.sample_id], question.text, max(KS))
                latencies.append((time.perf_counter() - started) * 1000)
                rows.append((question, measures(found, question.evidence)))
                if args.verbose and rows[-1][1]["R@10"] < 1:
                    print(f"  miss {question.evidence} {question.text!r} -> {found}")
    finally:
        searcher.close()
    via = "HTTP API" if args.http else "search service"
    mode = args.mode if args.mode_given or not args.http else "default"
    settings_note = " ".join(f"{k}={v}" for k, v in args.overrides.items())
    report(
        f"turn recall ({via}, protocol {args.protocol}, mode {mode}, {settings.EMBEDDING_PROVIDER} "
        f"embedder{', ' + settings_note if settings_note else ''})",
        rows,
    )
    print(
        f"  search latency: p50 {statistics.median(latencies):.1f} ms, "
        f"p95 {pct(latencies, 0.95):.1f} ms ({len(latencies)} searches)"
    )
    if searcher.rewrites:
        failed = [r.error for r in searcher.rewrites if r.error]
        queries = [len(r.queries) for r in searcher.rewrites]
        models = sorted({r.model for r in searcher.rewrites if r.model})
        print(
            f"  rewrite: model {', '.join(models) or '-'}, {statistics.fmean(queries):.2f} "
            f"queries per search, {len(failed)} of {len(queries)} searched as asked "
            f"(LLM failed or unusable)"
        )
        for error in sorted(set(failed))[:5]:
            print(f"    {error}")
        if args.verbose:
            for found in searcher.rewrites[:20]:
                print(f"    {found.queries}")


# --- personal facts ----------------------------------------------------------------------
def ensure_facts(conv: Conversation, fresh: bool) -> Any:
    from core.providers.embeddings import get_embedder
    from memories.engine.llm import PrecomputedEmbedder
    from memories.facts.models import Fact, Scope
    from memories.facts.scopes import end_user_ensure
    from memories.facts.services import FactIn, fact_add, scope_erase

    owner = bench_owner(f"bench-facts-{conv.sample_id}")
    embedder = get_embedder()
    stored = Fact.objects.filter(owner=owner, embedding_model=embedder.model).count()
    if stored == len(conv.facts) and not fresh:
        return owner
    for end_user in Scope.objects.filter(owner=owner):
        scope_erase(scope=end_user)
    Fact.objects.filter(owner=owner).delete()
    given = PrecomputedEmbedder(embedder, [fact for _, fact, _ in conv.facts])
    by_speaker: dict[str, list[Any]] = defaultdict(list)
    for speaker, fact, ids in conv.facts:
        by_speaker[speaker].append(FactIn(fact, metadata={"dia_ids": sorted(ids)}))
    for speaker, facts in by_speaker.items():
        # As given: each observation is a fact (only the same text is a duplicate).
        fact_add(owner=owner, scope=end_user_ensure(owner=owner, external_id=speaker),
                 facts=facts, reason="locomo observation", dedup_threshold=1.01,
                 max_facts=10**6, embedder=given)  # fmt: skip
    return owner


def fact_questions(args: argparse.Namespace, convs: list[Conversation]) -> Any:
    """(owner, fact id -> its turn ids, question, the end users asking it): each question
    asked as the speaker it names, or as both when it names neither or both."""
    from memories.facts.models import Fact, Scope

    for conv in convs:
        owner = ensure_facts(conv, args.fresh)
        ids_of = {
            v.pk: set(v.metadata.get("dia_ids", [])) for v in Fact.objects.filter(owner=owner)
        }
        users = {u.external_id: u for u in Scope.objects.filter(owner=owner)}
        for question in conv.questions:
            named = [s for s in conv.speakers if re.search(rf"\b{re.escape(s)}\b", question.text)]
            askers = [users[s] for s in (named if len(named) == 1 else conv.speakers)]
            yield owner, ids_of, question, askers


def run_facts(args: argparse.Namespace, convs: list[Conversation]) -> None:
    from core.providers.embeddings import get_embedder
    from memories.facts.search import fact_search
    from memories.proxy.chat import chat_prepare

    embedder = get_embedder()
    rows, injected_any, injected_counts, latencies = [], [], [], []
    in_block_any, in_block_counts = [], []
    for owner, ids_of, question, askers in fact_questions(args, convs):
        vector = embedder.embed([question.text])[0]
        ranked = []
        for speaker in askers:  # the one search of facts, as every door makes it
            ranked += fact_search(owner=owner, scope=speaker, query=question.text,
                                  limit=max(KS), query_vector=vector).hits  # fmt: skip
        ranked.sort(key=lambda h: -h.score)
        covered = [ids_of.get(h.id, set()) for h in ranked]
        scores = {
            k: len(question.evidence & set().union(*covered[:k])) / len(question.evidence)
            for k in KS
        }
        rows.append((question, scores))
        injected: list[Any] = []
        in_block: list[Any] = []
        started = time.perf_counter()
        for speaker in askers:
            body = {"messages": [{"role": "user", "content": question.text}]}
            prepared = chat_prepare(owner_id=owner.pk, body=body, external_id=speaker.external_id)
            # The ranked ones (the engine's injection then fills the rest of the
            # budget with the user's other facts by confidence, issue 12).
            injected += [h for h in prepared.memories if h.relevant]
            in_block += prepared.memories
        latencies.append((time.perf_counter() - started) * 1000 / len(askers))
        injected_counts.append(len(injected))
        injected_any.append(any(ids_of.get(h.id, set()) & question.evidence for h in injected))
        in_block_counts.append(len(in_block))
        in_block_any.append(any(ids_of.get(h.id, set()) & question.evidence for h in in_block))
    report(f"fact recall (personal memories, {settings.EMBEDDING_PROVIDER} embedder)", rows)
    print(
        f"  questions with an evidence fact injected: {statistics.fmean(injected_any):.3f} "
        "(marked relevant: memories.facts.injection.relevant_hits); "
        f"facts injected per question: mean {statistics.fmean(injected_counts):.2f}, "
        f"share with none {statistics.fmean(c == 0 for c in injected_counts):.3f}"
    )
    print(
        "  the whole block (ranked facts, then the rest of MEMORY_PROMPT_MAX_TOKENS "
        f"{settings.MEMORY_PROMPT_MAX_TOKENS} by confidence): an evidence fact in it for "
        f"{statistics.fmean(in_block_any):.3f} of the questions; facts per question: mean "
        f"{statistics.fmean(in_block_counts):.2f}"
    )
    print(f"  proxy retrieval latency: p50 {statistics.median(latencies):.1f} ms")


# --- an ordinary document base: the hand-written set (issue 25) --------------------------
DOCUMENT_DATA = ROOT / "bench" / "data" / "document_base_dev.json"


def run_documents(args: argparse.Namespace) -> None:
    """Each document of the set one document of a knowledge base (default chunking); a
    question's evidence: its answer documents' chunks, or for a long document the chunk
    holding its ``answer_text``. Searched as the API searches (default mode, top_k 20)."""
    data = json.loads(args.document_data.read_text())
    owner = bench_owner("bench-documents")
    conv = Conversation(
        "documents", ("", ""),
        [DocumentIn(text=d["text"], source_key=d["key"]) for d in data["documents"]], [],
    )  # fmt: skip
    kb = ensure_base(owner, conv, args.fresh)
    texts: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key, text in kb.chunks.order_by("chunk_index").values_list("source_key", "text"):
        texts[key.split("#")[0]].append((key, text))
    searcher = InProcess(args)
    searcher.search(kb, data["questions"][0]["text"], max(KS))  # warm-up
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    latencies = []
    for question in data["questions"]:
        evidence = set()
        for answer in question["answers"]:
            chunks = texts[answer]
            wanted = question.get("answer_text") if len(chunks) > 1 else None
            held = [k for k, t in chunks if wanted and wanted in " ".join(t.split())]
            evidence |= set(held or [k for k, _ in chunks])
        started = time.perf_counter()
        found = searcher.search(kb, question["text"], max(KS), key="source_key")
        latencies.append((time.perf_counter() - started) * 1000)
        row = measures(found, evidence)
        long = any(len(texts[a]) > 1 for a in question["answers"])
        for group in ("all", question["split"], "long documents" if long else "short documents"):
            rows[group].append(row)
        if args.verbose and row["R@10"] < 1:
            print(f"  miss {sorted(evidence)} {question['text']!r} -> {found[:10]}")
    print(f"\ndocument base ({args.document_data.name}: {len(data['documents'])} documents, "
          f"{kb.chunk_count} chunks; {settings.EMBEDDING_PROVIDER} embedder)")  # fmt: skip
    names = list(rows["all"][0])
    print(f"  {'':16} {'n':>5} " + " ".join(f"{n:>7}" for n in names))
    for group in ("all", "tune", "check", "short documents", "long documents"):
        values = rows[group]
        cells = " ".join(f"{statistics.fmean(v[n] for v in values):7.3f}" for n in names)
        print(f"  {group:16} {len(values):5d} {cells}")
    print(f"  search latency: p50 {statistics.median(latencies):.1f} ms")


# --- node memory: a store of turns -------------------------------------------------------
def ensure_store(owner: Any, conv: Conversation, fresh: bool) -> Any:
    """The conversation's turns as the items of one ``simple`` store (default config, the
    configured embedder), each with its ``dia_id`` in metadata; made once."""
    from memories.stores.config import memory_config_apply
    from memories.stores.models import MemoryItem, MemoryStore
    from memories.stores.services import backend_for, memory_store_delete
    from memories.stores.text import summary_hash

    store = MemoryStore.objects.filter(owner=owner, name=conv.sample_id).first()
    if store is not None and (fresh or store.items.count() != len(conv.documents)):
        memory_store_delete(store=store)
        store = None
    if store is None:
        config = {"max_items": len(conv.documents)}
        document = {"memory": [{"name": conv.sample_id, "type": "simple", "config": config}]}
        memory_config_apply(owner=owner, document=document, load=False)
        store = MemoryStore.objects.get(owner=owner, name=conv.sample_id)
        embedder = backend_for(store).embedder()
        assert embedder is not None
        texts = [d.text for d in conv.documents]
        vectors = embedder.embed(texts)
        MemoryItem.objects.bulk_create(
            MemoryItem(
                store=store,
                content_summary=text,
                summary_hash=summary_hash(text),
                metadata={"dia_id": d.source_key},
                embedding=list(map(float, v)),
                dimensions=len(v),
            )  # fmt: skip
            for d, text, v in zip(conv.documents, texts, vectors, strict=True)
        )
    return store


def run_stores(args: argparse.Namespace, convs: list[Conversation]) -> None:
    """Node memory on LoCoMo: each conversation one ``simple`` store of its turns, each
    question through the store's search (``memories.stores.search``, top_k 10, the store's
    own fusion of cosine and BM25): turn recall@5 and @10."""
    from memories.stores.search import ItemSearch, run
    from memories.stores.services import backend_for

    owner = bench_owner("bench-retrieval-stores")
    rows, latencies = [], []
    for conv in convs:
        store = ensure_store(owner, conv, args.fresh)
        backend = backend_for(store)
        embedder = backend.embedder()
        assert embedder is not None
        for question in conv.questions:
            started = time.perf_counter()
            search = ItemSearch.of(
                store, question.text, embedder.embed([question.text])[0], 10, None,
                backend.config["rerank_weight"],
            )  # fmt: skip
            hits = run([search])[0]
            latencies.append((time.perf_counter() - started) * 1000)
            found = [h.metadata.get("dia_id", "") for h in hits]
            rows.append(
                (question, {f"R@{k}": recall(found, question.evidence, k) for k in (5, 10)})
            )
    report(
        f"store of turns (a simple store per conversation; {settings.EMBEDDING_PROVIDER} embedder)",
        rows,
    )
    print(
        f"  store search latency: p50 {statistics.median(latencies):.1f} ms (with the query's embedding)"
    )


# --- personal facts through the chat proxy: the hand-written set (issue 25) --------------
PERSONAL_DATA = ROOT / "bench" / "data" / "personal_facts_dev.json"


def ensure_personal(data: dict[str, Any], fresh: bool) -> tuple[Any, dict[str, Any]]:
    """One owner; each user of the set an end user with their facts as given (fact id in
    metadata); reused while the facts are the same."""
    from core.providers.embeddings import get_embedder
    from memories.engine.llm import PrecomputedEmbedder
    from memories.facts.models import Fact, Scope
    from memories.facts.scopes import end_user_ensure
    from memories.facts.services import FactIn, fact_add, scope_erase

    text = json.dumps([u["facts"] for u in data["users"]], sort_keys=True)
    owner = bench_owner(f"bench-personal-{hashlib.sha256(text.encode()).hexdigest()[:12]}")
    embedder = get_embedder()
    total = sum(len(u["facts"]) for u in data["users"])
    if fresh or Fact.objects.filter(owner=owner, embedding_model=embedder.model).count() != total:
        for scope in Scope.objects.filter(owner=owner):
            scope_erase(scope=scope)
        Fact.objects.filter(owner=owner).delete()
        for user in data["users"]:
            contents = [f["content"] for f in user["facts"]]
            fact_add(owner=owner, scope=end_user_ensure(owner=owner, external_id=user["id"]),
                     facts=[FactIn(f["content"], metadata={"key": f["id"]}) for f in user["facts"]],
                     reason="bench", dedup_threshold=1.01, max_facts=10**6,
                     embedder=PrecomputedEmbedder(embedder, contents))  # fmt: skip
    keys = {f.pk: f.metadata.get("key") for f in Fact.objects.filter(owner=owner)}
    return owner, keys


def run_personal(args: argparse.Namespace) -> None:
    """Each question asked by its end user as the chat proxy asks it (``chat_prepare``: the
    memory block of ``/v1/chat/completions``): is the fact it is about marked relevant, how
    many are, where the fact sits in the block; and the one search's rank of it."""
    from memories.facts.models import Scope
    from memories.facts.search import fact_search
    from memories.proxy.chat import chat_prepare

    data = json.loads(args.personal_data.read_text())
    owner, keys = ensure_personal(data, args.fresh)
    scopes = {s.external_id: s for s in Scope.objects.filter(owner=owner)}
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    latencies: list[float] = []
    for user in data["users"]:
        for question in user["questions"]:
            body = {"messages": [{"role": "user", "content": question["text"]}]}
            started = time.perf_counter()
            prepared = chat_prepare(owner_id=owner.pk, body=body, external_id=user["id"])
            latencies.append((time.perf_counter() - started) * 1000)
            marked = [keys.get(m.id) for m in prepared.memories if m.relevant]
            block = [keys.get(m.id) for m in prepared.memories]
            hits = fact_search(owner=owner, scope=scopes[user["id"]], query=question["text"],
                               limit=40).hits  # fmt: skip
            ranked = [keys.get(h.id) for h in hits]
            target = question["fact"]
            rank = ranked.index(target) + 1 if target in ranked else 99
            row = {
                "marked": float(target in marked),
                "n marked": float(len(marked)),
                "first": float(bool(marked) and marked[0] == target),
                "in block": float(target in block),
                "R@1": float(rank <= 1),
                "R@2": float(rank <= 2),
                "R@3": float(rank <= 3),
                "R@5": float(rank <= 5),
            }
            rows[user["split"]].append(row)
            rows["all"].append(row)
            if args.verbose and not row["marked"]:
                print(f"  miss {user['id']} {question['text']!r} -> {target}, marked {marked}")
    print(f"\npersonal facts through the chat proxy ({args.personal_data.name}, "
          f"{settings.EMBEDDING_PROVIDER} embedder)")  # fmt: skip
    names = list(rows["all"][0])
    print(f"  {'':8} {'n':>5} " + " ".join(f"{n:>9}" for n in names))
    for split in ("tune", "check", "all"):
        values = rows[split]
        cells = " ".join(f"{statistics.fmean(v[n] for v in values):9.3f}" for n in names)
        print(f"  {split:8} {len(values):5d} {cells}")
    print(f"  chat_prepare latency: p50 {statistics.median(latencies):.1f} ms")


# --- the engine's core-fact search: BM25 (its keyword leg) against ts_rank (before) -------
LEG_MS: dict[str, list[float]] = defaultdict(list)

# The engine's keyword leg before BM25 (main at ca18893, ``scope_keyword_ranking``): the
# scope's facts sharing a word with the text, by ``ts_rank``.
TS_RANK_SQL = (
    "WITH q AS (SELECT coalesce((SELECT string_agg(quote_literal(l), ' | ') "
    "FROM unnest(tsvector_to_array(to_tsvector('english'::regconfig, %s))) l), '')"
    "::tsquery AS words, quote_literal(%s)::tsquery AS scope) "
    "SELECT id, ts_rank(search_vector, q.words) AS r FROM memories_fact, q"
    " WHERE numnode(q.words) > 0 AND search_vector @@ (q.words && q.scope)"
    " ORDER BY r DESC, id LIMIT %s"
)


def ts_rank_ranking(scope_id: int, text: str, limit: int) -> list[tuple[Any, float]]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(TS_RANK_SQL, [text, f"~scope:{scope_id}", limit])
        return [(row[0], float(row[1])) for row in cur.fetchall()]


def engine_rankings(
    owner: Any, user: Any, query: str, vector: list[float], model: str, k: int
) -> dict[str, list[tuple[Any, float]]]:
    """The scope's top ``k`` (fact id, score) three ways: the engine's own search
    (``fact_search``, no decay: BM25 keyword leg), its merge replayed in Python over
    the same two legs (w x cosine + (1 - w) x BM25 / best BM25, the keyword leg from
    ``fact_keyword_leg``: must agree with it), and the same merge with the keyword
    leg the engine had before (``ts_rank``, ``TS_RANK_SQL``). Equal scores: newer first,
    then id, as the engine orders them."""
    from memories.facts.models import Fact
    from memories.facts.search import (
        FACTS,
        _pool,
        fact_keyword_leg,
        fact_search,
        fact_vector_leg,
    )

    engine = fact_search(
        owner=owner, scope=user, query=query, limit=k, half_life_days=0, query_vector=vector
    )
    pool = _pool(k, 0)
    weight = FACTS.vector_weight
    cosine = {r[0]: 1.0 - float(r[1]) for r in fact_vector_leg(user, vector, model, pool).run()}
    started = time.perf_counter()
    ts_rank = dict(ts_rank_ranking(user.pk, query, pool))
    middle = time.perf_counter()
    leg = fact_keyword_leg(user, query, pool)
    bm25 = {r[0]: float(r[1]) for r in leg.run()} if leg is not None else {}
    LEG_MS["ts_rank"].append((middle - started) * 1000)
    LEG_MS["bm25"].append((time.perf_counter() - middle) * 1000)
    observed = dict(
        Fact.objects.filter(pk__in={*cosine, *ts_rank, *bm25}).values_list("id", "observed_at")
    )
    out = {"engine": [(h.id, h.score) for h in engine.hits]}
    for name, keyword in {"bm25": bm25, "ts_rank": ts_rank}.items():
        best = max(keyword.values(), default=0.0) or 1.0
        scores = {
            fid: weight * max(cosine.get(fid, 0.0), 0.0)
            + (1 - weight) * keyword.get(fid, 0.0) / best
            for fid in {*cosine, *keyword}
        }
        ordered = sorted(scores, key=lambda fid: str(fid))
        ordered.sort(key=lambda fid: observed[fid], reverse=True)
        ordered.sort(key=lambda fid: -scores[fid])
        out[name] = [(fid, scores[fid]) for fid in ordered[:k]]
    return out


def run_engine_facts(args: argparse.Namespace, convs: list[Conversation]) -> None:
    from core.providers.embeddings import get_embedder

    embedder = get_embedder()
    rows: dict[str, list] = defaultdict(list)
    latencies = []
    for owner, ids_of, question, askers in fact_questions(args, convs):
        vector = [float(x) for x in embedder.embed([question.text])[0]]
        ranked: dict[str, list] = defaultdict(list)
        for speaker in askers:
            started = time.perf_counter()
            found = engine_rankings(owner, speaker, question.text, vector, embedder.model, max(KS))
            latencies.append((time.perf_counter() - started) * 1000)
            for name, hits in found.items():
                ranked[name] += hits
        for name, hits in ranked.items():
            hits.sort(key=lambda h: -h[1])  # as run_facts: both askers' facts by score
            covered = [ids_of.get(fid, set()) for fid, _ in hits]
            scores = {
                k: len(question.evidence & set().union(*covered[:k])) / len(question.evidence)
                for k in KS
            }
            rows[name].append((question, scores))
    titles = {
        "engine": "the engine's search (fact_search: BM25 keyword leg, no decay)",
        "bm25": "replayed in Python: w x cosine + (1 - w) x BM25 / best",
        "ts_rank": "the same merge, keyword leg ts_rank (the engine before BM25)",
    }
    from memories.facts.search import FACTS

    weight = FACTS.vector_weight
    for name, title in titles.items():
        report(f"fact recall, {title}, facts' vector_weight {weight}", rows[name])
    agree = statistics.fmean(
        a[1] == b[1] for a, b in zip(rows["engine"], rows["bm25"], strict=True)
    )
    print(f"  the replay's recall equals the engine's on {agree:.3f} of the questions")
    print(f"  three rankings per asker: p50 {statistics.median(latencies):.1f} ms")
    print(
        "  keyword leg alone, p50: ts_rank (before) "
        f"{statistics.median(LEG_MS['ts_rank']):.1f} ms, BM25 (fact_keyword_leg) "
        f"{statistics.median(LEG_MS['bm25']):.1f} ms"
    )


def parse_overrides(values: list[str]) -> dict[str, Any]:
    """``--set`` values as {"chunks.vector_weight": 0.5, ...}, checked and typed."""
    out: dict[str, Any] = {}
    for value in values:
        name, _, raw = value.partition("=")
        target, _, attr = name.partition(".")
        current = getattr(
            _override_target(target),
            attr.lower() if target in ("chunks", "context", "facts", "items") else attr,
            None,
        )
        if current is None:
            raise SystemExit(f"--set {value}: not a collection option or a retrieval constant")
        out[name] = type(current)(raw) if not isinstance(current, bool) else raw == "1"
    return out


def _override_target(target: str) -> Any:
    from knowledge import search as chunks
    from knowledge.retrieval import bm25, dates, hnsw
    from memories.facts import search as facts
    from memories.stores import search as stores

    return {
        "items": stores.ITEMS,
        "factsearch": facts,
        "chunks": chunks.CHUNKS,
        "context": chunks.CHUNKS.context,
        "facts": facts.FACTS,
        "hnsw": hnsw,
        "bm25": bm25,
        "dates": dates,
        "search": chunks,
    }.get(target)


def apply_overrides(overrides: dict[str, Any]) -> None:
    from dataclasses import replace

    from knowledge import search as chunks
    from memories.facts import search as facts
    from memories.stores import search as stores

    for name, value in overrides.items():
        target, _, attr = name.partition(".")
        if target == "chunks":
            chunks.CHUNKS = replace(chunks.CHUNKS, **{attr: value})
        elif target == "context":
            context = replace(chunks.CHUNKS.context, **{attr: value})
            chunks.CHUNKS = replace(chunks.CHUNKS, context=context)
        elif target == "facts":
            facts.FACTS = replace(facts.FACTS, **{attr: value})
        elif target == "items":
            stores.ITEMS = replace(stores.ITEMS, **{attr: value})
        else:
            setattr(_override_target(target), attr, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", nargs="*", help="sample ids (default: all)")
    parser.add_argument("--mode", choices=("hybrid", "vector", "keyword"))
    parser.add_argument("--rrf-k", type=int, default=None)
    parser.add_argument(
        "--rewrite",
        action="store_true",
        help="opt-in query rewriting (needs LLM_BASE_URL and LLM_MODEL in the environment)",
    )
    parser.add_argument(
        "--rewrite-cache",
        type=Path,
        help="with --rewrite: keep the LLM's rewrites per question in this JSON file, reuse them",
    )
    parser.add_argument(
        "--language",
        default="english",
        help="the bases' text-search configuration (english_nostop: no stop words)",
    )
    parser.add_argument(
        "--dates",
        choices=("none", "text"),
        default="none",
        help="text: each turn's text starts with its session's date",
    )
    parser.add_argument(
        "--protocol",
        choices=("sessions", "documents", "senders"),
        default="sessions",
        help="sessions (the README's measurement): each turn with its LoCoMo session as "
        "session_id and its date as timestamp; documents: each turn alone; senders: as "
        "sessions, the speaker as sender, not in the text",
    )
    parser.add_argument(
        "--vectors",
        type=Path,
        help="an .npz of another embedder's turn and question vectors (in process only)",
    )
    parser.add_argument(
        "--question-words",
        action="store_true",
        help="prototype: the keyword leg's query without QUESTION_WORDS",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a ranking constant: chunks.<option>, facts.<option>, hnsw.<NAME>, bm25.<NAME>",
    )
    parser.add_argument("--http", action="store_true", help="search through a served instance")
    parser.add_argument("--facts", action="store_true", help="also the personal-memory yardstick")
    parser.add_argument("--facts-only", action="store_true")
    parser.add_argument(
        "--engine-facts",
        action="store_true",
        help="the facts yardstick through the engine's core-fact search, BM25 vs ts_rank",
    )
    parser.add_argument(
        "--personal",
        action="store_true",
        help="only the personal-facts set through the chat proxy (--personal-data)",
    )
    parser.add_argument(
        "--stores", action="store_true", help="also node memory: a store of turns per conversation"
    )
    parser.add_argument("--personal-data", type=Path, default=PERSONAL_DATA)
    parser.add_argument(
        "--documents",
        action="store_true",
        help="also the document-base set (--document-data): ordinary documents, no sessions",
    )
    parser.add_argument("--document-data", type=Path, default=DOCUMENT_DATA)
    parser.add_argument("--fresh", action="store_true", help="rebuild bases and facts")
    parser.add_argument("--verbose", action="store_true", help="print the misses")
    args = parser.parse_args()
    args.mode_given = args.mode is not None
    args.mode = args.mode or "hybrid"
    args.overrides = parse_overrides(args.overrides)
    if args.overrides and args.http:
        raise SystemExit("--set changes constants in this process: not with --http")
    apply_overrides(args.overrides)
    call_command("migrate", verbosity=0)
    if args.question_words:
        patch_keyword_query()
    if args.rewrite_cache:
        cache_rewrites(args.rewrite_cache)
    if args.personal:
        run_personal(args)
        return
    if args.vectors:
        global PRECOMPUTED
        PRECOMPUTED = Precomputed(args.vectors)
    convs = load(args.data, args.conversations, args.dates, args.protocol)
    print(
        f"{len(convs)} conversations, {sum(len(c.documents) for c in convs)} turns, "
        f"{sum(len(c.questions) for c in convs)} questions, "
        f"{sum(len(c.facts) for c in convs)} facts",
        file=sys.stderr,
    )
    if not (args.facts_only or args.engine_facts):
        run_turns(args, convs)
    if args.documents:
        run_documents(args)
    if args.stores:
        run_stores(args, convs)
    if args.facts or args.facts_only:
        run_facts(args, convs)
    if args.engine_facts:
        run_engine_facts(args, convs)


if __name__ == "__main__":
    main()
