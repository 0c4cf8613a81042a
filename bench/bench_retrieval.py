"""Retrieval quality on LoCoMo: turn recall of knowledge search, fact recall of personal memory.

Run from the repository root, against a private database:

    EMBEDDED_DB_NAME=bench_retrieval .venv/bin/python bench/bench_retrieval.py \\
        [--data ../shared/data/locomo-dev/locomo-dev.json] [--mode hybrid] [--http] [--facts]

(``EMBEDDED_DB_NAME`` defaults to ``bench_retrieval`` here; the embedder is the configured
one, the local MiniLM by default, and no LLM is used.) The measurement is the one
``locomo-dev/README.md`` defines:

* each conversation is one knowledge base; each turn of every ``session_N`` one document
  ``"<speaker>: <text>"`` with its ``dia_id`` as ``source_key`` and in metadata (one batch
  per conversation, sessions in order). Bases are reused while their documents and embedder
  are the same (the name carries a fingerprint); ``--fresh`` rebuilds them;
* questions: every ``qa`` entry but category 5, evidence ids normalised (``"D8:6; D9:17"``
  is two ids, ``"D:11:26"`` is ``D11:26``, ``"D30:05"`` is ``D30:5``), ids matching no turn
  dropped, questions left without evidence skipped;
* recall@k of a question = |evidence ids among the top k hits| / |evidence ids|, averaged;
  printed overall, per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) and
  per conversation, with the search's p50/p95 latency.

Searches go through ``knowledge.search.search_chunks`` in process, or with ``--http``
through ``POST /api/v1/knowledge-bases/{id}/search`` of an instance this script serves on
127.0.0.1 (``manage.py serve --no-worker``, same database). ``--mode`` and ``--rrf-k``
are the API's own parameters; ``--set NAME=VALUE`` overrides a ``SEARCH_*`` setting in
process (and in the served instance's environment), for tuning.

``--facts`` adds the personal-memory yardstick: every session's ``observation`` facts are
stored (``memories.personal.services.memory_add``) as personal memories of end users named after
the speakers (one owner per conversation), with their turn ids in metadata. Each question
is then asked as the chat proxy asks it (``memories.personal.chat.chat_prepare``: the proxy's
retrieval at MEMORY_SCORE_THRESHOLD and MEMORY_TOP_K, then its token budget), as each
speaker the question names (both when it names neither or both). Printed: fact recall@k
(share of the evidence turns covered by the top-k facts, no threshold), the share of
questions with at least one evidence fact injected, and the mean number of facts injected.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
KS = (5, 10)


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


def load(path: Path, only: list[str] | None) -> list[Conversation]:
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
            for turn in conv[key]:
                documents.append(
                    DocumentIn(
                        text=f"{turn['speaker']}: {turn['text']}",
                        source_key=turn["dia_id"],
                        metadata={"dia_id": turn["dia_id"]},
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


def _embedding_fields() -> dict[str, Any]:
    from core.providers.embeddings import EmbeddingConfig

    config = EmbeddingConfig.from_settings()
    return {
        "embedding_provider": config.provider,
        "embedding_model": config.model,
        "embedding_dimensions": config.dimensions,
    }


def ensure_base(owner: Any, conv: Conversation, fresh: bool) -> KnowledgeBase:
    documents = [(d.text, d.source_key) for d in conv.documents]
    text = repr((sorted(_embedding_fields().items()), documents))
    name = f"locomo-{conv.sample_id}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    existing = KnowledgeBase.objects.filter(owner=owner, name=name).first()
    if existing is not None and (fresh or existing.chunk_count != len(conv.documents)):
        knowledge_base_delete(knowledge_base=existing)
        existing = None
    if existing is not None:
        return existing
    kb = knowledge_base_create(owner=owner, name=name)
    started = time.perf_counter()
    knowledge_base_ingest(knowledge_base=kb, documents=conv.documents)
    print(
        f"ingested {conv.sample_id}: {len(conv.documents)} turns in "
        f"{time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return kb


# --- searching ---------------------------------------------------------------------------
class InProcess:
    def __init__(self, args: argparse.Namespace):
        self.args = args

    def search(self, kb: KnowledgeBase, query: str, top_k: int) -> list[str]:
        request = SearchRequest(
            query=query, top_k=top_k, mode=self.args.mode, rrf_k=self.args.rrf_k
        )
        hits = search_chunks(bases=[kb], request=request)
        return [h.metadata.get("dia_id", "") for h in hits]

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
        env = {**os.environ, **{k: str(v) for k, v in args.overrides.items()}}
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
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v1/knowledge-bases/{kb.pk}/search",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            results = json.loads(response.read())["results"]
        return [r["metadata"].get("dia_id", "") for r in results]

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


def report(title: str, rows: list[tuple[Question, dict[int, float]]]) -> None:
    groups: dict[str, list[dict[int, float]]] = defaultdict(list)
    for question, scores in rows:
        groups["all"].append(scores)
        groups[f"{question.category} {CATEGORIES[question.category]}"].append(scores)
        groups[question.conversation].append(scores)
    print(f"\n{title}")
    print(f"  {'':16} {'n':>5} " + " ".join(f"{'R@' + str(k):>7}" for k in KS))
    order = [
        "all",
        *sorted(k for k in groups if k[0].isdigit()),
        *sorted(k for k in groups if k.startswith("conv")),
    ]
    for name in order:
        values = groups[name]
        cells = " ".join(f"{statistics.fmean(v[k] for v in values):7.3f}" for k in KS)
        print(f"  {name:16} {len(values):5d} {cells}")


def run_turns(args: argparse.Namespace, convs: list[Conversation]) -> None:
    owner = bench_owner("bench-retrieval")
    bases = {conv.sample_id: ensure_base(owner, conv, args.fresh) for conv in convs}
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
                rows.append((question, {k: recall(found, question.evidence, k) for k in KS}))
                if args.verbose and rows[-1][1][10] < 1:
                    print(f"  miss {question.evidence} {question.text!r} -> {found}")
    finally:
        searcher.close()
    via = "HTTP API" if args.http else "search service"
    mode = args.mode if args.mode_given or not args.http else "default"
    settings_note = " ".join(f"{k}={v}" for k, v in args.overrides.items())
    report(
        f"turn recall ({via}, mode {mode}, {settings.EMBEDDING_PROVIDER} "
        f"embedder{', ' + settings_note if settings_note else ''})",
        rows,
    )
    print(
        f"  search latency: p50 {statistics.median(latencies):.1f} ms, "
        f"p95 {pct(latencies, 0.95):.1f} ms ({len(latencies)} searches)"
    )


# --- personal facts ----------------------------------------------------------------------
def ensure_facts(conv: Conversation, fresh: bool) -> Any:
    from core.providers.embeddings import get_embedder
    from memories.personal.models import EndUser, Vector
    from memories.personal.services import end_user_ensure, end_user_erase, memory_add

    owner = bench_owner(f"bench-facts-{conv.sample_id}")
    embedder = get_embedder()
    stored = Vector.objects.filter(owner=owner, embedding_model=embedder.model).count()
    if stored == len(conv.facts) and not fresh:
        return owner
    for end_user in EndUser.objects.filter(owner=owner):
        end_user_erase(end_user=end_user)
    Vector.objects.filter(owner=owner).delete()
    vectors = embedder.embed([fact for _, fact, _ in conv.facts])
    for (speaker, fact, ids), vector in zip(conv.facts, vectors):
        end_user = end_user_ensure(owner=owner, external_id=speaker)
        memory_add(
            end_user=end_user,
            content=fact,
            embedding=[float(x) for x in vector],
            embedder=embedder,
            metadata={"dia_ids": sorted(ids)},
        )
    return owner


def run_facts(args: argparse.Namespace, convs: list[Conversation]) -> None:
    from core.providers.embeddings import get_embedder
    from memories.personal.chat import chat_prepare
    from memories.personal.models import EndUser, Vector
    from memories.personal.selectors import memory_search

    embedder = get_embedder()
    rows, injected_any, injected_counts, latencies = [], [], [], []
    for conv in convs:
        owner = ensure_facts(conv, args.fresh)
        ids_of = {
            v.pk: set(v.metadata.get("dia_ids", [])) for v in Vector.objects.filter(owner=owner)
        }
        users = {u.external_id: u for u in EndUser.objects.filter(owner=owner)}
        for question in conv.questions:
            named = [s for s in conv.speakers if re.search(rf"\b{re.escape(s)}\b", question.text)]
            askers = named if len(named) == 1 else list(conv.speakers)
            vector = embedder.embed([question.text])[0]
            ranked = []
            for speaker in askers:
                ranked += memory_search(
                    owner_id=owner.pk,
                    end_user=users[speaker],
                    vector=vector,
                    embedding_model=embedder.model,
                    top_k=max(KS),
                    query=question.text if settings.MEMORY_HYBRID else None,
                )
            ranked.sort(key=lambda h: -h.score)
            covered = [ids_of.get(h.id, set()) for h in ranked]
            scores = {
                k: len(question.evidence & set().union(*covered[:k])) / len(question.evidence)
                for k in KS
            }
            rows.append((question, scores))
            injected: list[Any] = []
            started = time.perf_counter()
            for speaker in askers:
                body = {"messages": [{"role": "user", "content": question.text}]}
                prepared = chat_prepare(owner_id=owner.pk, body=body, external_id=speaker)
                # The ranked ones (the engine's injection then fills the rest of the
                # budget with the user's other facts by confidence, issue 12).
                injected += [h for h in prepared.memories if h.relevant]
            latencies.append((time.perf_counter() - started) * 1000 / len(askers))
            injected_counts.append(len(injected))
            injected_any.append(any(ids_of.get(h.id, set()) & question.evidence for h in injected))
    report(f"fact recall (personal memories, {settings.EMBEDDING_PROVIDER} embedder)", rows)
    print(
        f"  questions with an evidence fact injected: {statistics.fmean(injected_any):.3f} "
        f"(threshold {settings.MEMORY_SCORE_THRESHOLD}, relative "
        f"{settings.MEMORY_RELATIVE_THRESHOLD}, hybrid {settings.MEMORY_HYBRID}, "
        f"top_k {settings.MEMORY_TOP_K}); "
        f"facts injected per question: mean {statistics.fmean(injected_counts):.2f}, "
        f"share with none {statistics.fmean(c == 0 for c in injected_counts):.3f}"
    )
    print(f"  proxy retrieval latency: p50 {statistics.median(latencies):.1f} ms")


def parse_overrides(values: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for value in values:
        name, _, raw = value.partition("=")
        if not name.startswith(("SEARCH_", "MEMORY_")) or not hasattr(settings, name):
            raise SystemExit(f"--set {value}: not a SEARCH_*/MEMORY_* setting")
        current = getattr(settings, name)
        out[name] = type(current)(raw) if not isinstance(current, bool) else raw == "1"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", nargs="*", help="sample ids (default: all)")
    parser.add_argument("--mode", choices=("hybrid", "vector", "keyword"))
    parser.add_argument("--rrf-k", type=int, default=None)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a SEARCH_*/MEMORY_* setting",
    )
    parser.add_argument("--http", action="store_true", help="search through a served instance")
    parser.add_argument("--facts", action="store_true", help="also the personal-memory yardstick")
    parser.add_argument("--facts-only", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="rebuild bases and facts")
    parser.add_argument("--verbose", action="store_true", help="print the misses")
    args = parser.parse_args()
    args.mode_given = args.mode is not None
    args.mode = args.mode or "hybrid"
    args.overrides = parse_overrides(args.overrides)
    for name, value in args.overrides.items():
        setattr(settings, name, value)
    call_command("migrate", verbosity=0)
    convs = load(args.data, args.conversations)
    print(
        f"{len(convs)} conversations, {sum(len(c.documents) for c in convs)} turns, "
        f"{sum(len(c.questions) for c in convs)} questions, "
        f"{sum(len(c.facts) for c in convs)} facts",
        file=sys.stderr,
    )
    if not args.facts_only:
        run_turns(args, convs)
    if args.facts or args.facts_only:
        run_facts(args, convs)


if __name__ == "__main__":
    main()
