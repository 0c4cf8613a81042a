"""The ingestion helper: idempotent, all-or-nothing, counters exact."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from core.errors import NameTaken
from core.providers.errors import ProviderError
from knowledge.models import Chunk, KnowledgeBase
from knowledge.selectors import kb_embedder
from knowledge.services import (
    DocumentIn,
    IngestCancelled,
    KnowledgeError,
    knowledge_base_create,
    knowledge_base_delete,
    knowledge_base_delete_chunks,
    knowledge_base_ingest,
)
from knowledge.services import ingest as ingest_module
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db

LONG = " ".join(f"word{i}" for i in range(400))  # ~3,600 characters -> several chunks


def _rows(kb):
    return list(
        Chunk.objects.filter(knowledge_base=kb)
        .order_by("source_key")
        .values_list("id", "source_key", "text", "chunk_index", "chunk_total")
    )


def test_create_fixes_embedding_config_and_chunking(alice, settings):
    kb = make_kb(alice)
    assert (kb.embedding_provider, kb.embedding_model, kb.embedding_dimensions) == (
        "hashing",
        "hashing-v1",
        384,
    )
    assert (kb.chunk_size, kb.chunk_overlap) == (1000, 100)
    files = make_kb(alice, name="docs", source_kind="files")
    assert (files.chunk_size, files.chunk_overlap) == (500, 50)


def test_names_are_unique_per_owner(alice, bob):
    make_kb(alice, name="same")
    make_kb(bob, name="same")  # another owner may reuse it
    with pytest.raises(NameTaken):
        make_kb(alice, name="same")
    assert KnowledgeBase.objects.filter(name="same").count() == 2


def test_ingest_writes_chunks_with_metadata_and_counters(alice):
    kb = make_kb(alice)
    ingest(
        kb,
        (
            "m1",
            LONG,
            {
                "session_id": "s1",
                "flow_id": "f1",
                "source_type": "message",
                "timestamp": "2026-01-02T03:04:05Z",
                "topic": "demo",
            },
        ),
        ("m2", "short note about cats", {"session_id": "s2"}),
    )
    chunks = Chunk.objects.filter(knowledge_base=kb).order_by("source_key")
    long_chunks = [c for c in chunks if c.document_key == "m1"]
    assert [c.source_key for c in long_chunks] == [f"m1#{i}" for i in range(len(long_chunks))]
    assert len(long_chunks) == 4
    first = long_chunks[0]
    assert (first.session_id, first.flow_id, first.source_type) == ("s1", "f1", "message")
    assert first.metadata == {"topic": "demo"}
    assert first.source_timestamp.isoformat() == "2026-01-02T03:04:05+00:00"
    assert all(c.chunk_total == 4 for c in long_chunks)
    assert all(len(c.text) <= 1000 for c in long_chunks)
    kb.refresh_from_db()
    texts = [c.text for c in chunks]
    assert kb.chunk_count == 5
    assert kb.char_count == sum(len(t) for t in texts)
    assert kb.word_count == sum(len(t.split()) for t in texts)
    assert kb.size_bytes == sum(len(t.encode()) for t in texts)
    assert kb.source_types == ["message"]
    assert kb.embedding_metadata()["avg_chunk_size"] == round(kb.char_count / 5, 1)


def test_reingesting_the_same_batch_yields_the_same_rows(alice):
    kb = make_kb(alice)
    docs = [DocumentIn(text=LONG, source_key="a"), DocumentIn(text="tiny", source_key="b")]
    knowledge_base_ingest(knowledge_base=kb, documents=docs)
    before = _rows(kb)
    result = knowledge_base_ingest(knowledge_base=kb, documents=docs)
    assert _rows(kb) == before  # same ids, keys and texts: updated in place
    assert (result.chunks_written, result.chunks_deleted) == (5, 0)
    kb.refresh_from_db()
    assert kb.chunk_count == 5


def test_reingesting_a_shorter_document_drops_its_extra_chunks(alice):
    kb = make_kb(alice)
    ingest(kb, ("a", LONG), ("b", "other document"))
    result = knowledge_base_ingest(
        knowledge_base=kb, documents=[DocumentIn(text="now short", source_key="a")]
    )
    assert result.chunks_deleted == 3
    assert [(r[1], r[2]) for r in _rows(kb)] == [("a#0", "now short"), ("b#0", "other document")]
    kb.refresh_from_db()
    assert (kb.chunk_count, kb.char_count) == (2, len("now short") + len("other document"))


def test_embedding_failure_writes_nothing(alice, monkeypatch):
    kb = make_kb(alice)
    ingest(kb, ("kept", "already here"))

    class Broken:
        def embed(self, texts):
            raise ProviderError("embedding endpoint down")

    monkeypatch.setattr(ingest_module, "kb_embedder", lambda kb: Broken())
    with pytest.raises(ProviderError):
        ingest(kb, ("new", "never stored"))
    assert [r[1] for r in _rows(kb)] == ["kept#0"]
    kb.refresh_from_db()
    assert kb.chunk_count == 1


def test_failure_inside_the_write_rolls_back_everything(alice, monkeypatch):
    kb = make_kb(alice)
    ingest(kb, ("kept", "already here"))

    def explode(cur, kb, old, new):
        raise RuntimeError("crash after the upsert, before commit")

    monkeypatch.setattr(ingest_module, "_apply_stats_delta", explode)
    with pytest.raises(RuntimeError):
        ingest(kb, ("kept", "changed text"), ("new", "never stored"))
    assert [(r[1], r[2]) for r in _rows(kb)] == [("kept#0", "already here")]


def test_cancellation_before_write(alice):
    kb = make_kb(alice)
    with pytest.raises(IngestCancelled):
        knowledge_base_ingest(
            knowledge_base=kb,
            documents=[DocumentIn(text="x", source_key="x")],
            should_cancel=lambda: True,
        )
    assert _rows(kb) == []


def test_duplicate_keys_in_a_batch_are_refused(alice):
    kb = make_kb(alice)
    with pytest.raises(KnowledgeError, match="unique"):
        ingest(kb, ("same", "one"), ("same", "two"))
    assert _rows(kb) == []


def test_bad_timestamp_is_refused_and_writes_nothing(alice):
    kb = make_kb(alice)
    with pytest.raises(KnowledgeError, match="ISO 8601"):
        ingest(kb, ("a", "text", {"timestamp": "yesterday"}))
    assert _rows(kb) == []


def test_embeddings_are_stored_as_given(alice):
    kb = make_kb(alice)
    ingest(kb, ("a", "hello vector world"))
    stored = np.asarray(Chunk.objects.get(knowledge_base=kb).embedding)
    expected = kb_embedder(kb).embed(["hello vector world"])[0]
    np.testing.assert_allclose(stored, expected, rtol=1e-6)


def test_full_text_column_is_generated(alice):
    kb = make_kb(alice)
    ingest(kb, ("a", "The running foxes jumped"))
    with connection.cursor() as cur:
        cur.execute(
            "SELECT search_vector::text FROM knowledge_chunk WHERE knowledge_base_id = %s", [kb.pk]
        )
        assert cur.fetchone()[0] == "'fox':3 'jump':4 'run':2"


def test_delete_session_chunks_keeps_counters_exact(alice):
    kb = make_kb(alice)
    ingest(kb, ("a", "alpha text", {"session_id": "s1"}), ("b", "beta text", {"session_id": "s2"}))
    assert knowledge_base_delete_chunks(knowledge_base=kb, session_id="s1") == 1
    assert [r[1] for r in _rows(kb)] == ["b#0"]
    kb.refresh_from_db()
    assert (kb.chunk_count, kb.char_count) == (1, len("beta text"))


def test_delete_base_removes_its_chunks_only(alice):
    kb = make_kb(alice, name="one")
    other = make_kb(alice, name="two")
    ingest(kb, ("a", "gone"))
    ingest(other, ("a", "stays"))
    knowledge_base_delete(knowledge_base=kb)
    assert list(Chunk.objects.values_list("text", flat=True)) == ["stays"]


def test_unknown_language_is_refused(alice):
    with pytest.raises(KnowledgeError):
        knowledge_base_create(owner=alice, name="x", language="klingon")
    assert not KnowledgeBase.objects.exists()


def test_document_source_is_typed_and_the_payload_shape_maps_to_it():
    from datetime import UTC, datetime

    with pytest.raises(TypeError, match="session_id"):
        DocumentIn(text="t", source_key="k", metadata={"session_id": "s1"})
    doc = DocumentIn.from_payload(
        text="t",
        source_key="k",
        metadata={"session_id": "s1", "message_id": 7, "timestamp": "2026-01-02T03:04:05Z", "x": 1},
    )
    assert (doc.session_id, doc.message_id, dict(doc.metadata)) == ("s1", "7", {"x": 1})
    assert doc.timestamp == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert DocumentIn.from_payload(**doc.payload()) == doc
    with pytest.raises(KnowledgeError, match="ISO 8601"):
        DocumentIn.from_payload(text="t", source_key="k", metadata={"timestamp": "yesterday"})
