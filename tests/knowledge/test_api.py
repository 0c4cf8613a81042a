"""Knowledge-base API: CRUD, ingestion, search, tenancy, bad input."""

from __future__ import annotations

import pytest

from knowledge.models import Chunk, KnowledgeBase
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db
ERR_KEYS = {"code", "message", "details"}


def _docs(*texts, **meta):
    return {
        "documents": [
            {"text": t, "source_key": f"k{i}", "metadata": meta} for i, t in enumerate(texts)
        ]
    }


def test_create_and_list_shows_memory_bases_marked(alice, alice_client):
    response = alice_client.post(
        "/api/v1/knowledge-bases", {"name": "notes", "description": "d"}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "notes"
    assert body["embedding"] == {"provider": "hashing", "model": "hashing-v1", "dimensions": 384}
    assert body["metadata"]["chunks"] == 0 and body["metadata"]["is_memory_base"] is False
    make_kb(alice, name="mb", is_memory_base=True)
    listed = alice_client.get("/api/v1/knowledge-bases").json()
    assert [(kb["name"], kb["is_memory_base"]) for kb in listed["results"]] == [
        ("mb", True),
        ("notes", False),
    ]


def test_duplicate_name_is_409(alice, alice_client):
    make_kb(alice, name="notes")
    response = alice_client.post("/api/v1/knowledge-bases", {"name": "notes"}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "name_taken"
    assert KnowledgeBase.objects.filter(owner=alice).count() == 1


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"name": "   "},
        {"name": "x" * 201},
        {"name": "a", "chunk_size": 100, "chunk_overlap": 100},
        {"name": "a", "language": "klingon"},
    ],
)
def test_create_bad_input_is_400_and_stores_nothing(alice_client, payload):
    response = alice_client.post("/api/v1/knowledge-bases", payload, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]) == ERR_KEYS
    assert not KnowledgeBase.objects.exists()


def test_patch_and_delete(alice, alice_client):
    kb = make_kb(alice)
    ingest(kb, ("a", "some text"))
    response = alice_client.patch(
        f"/api/v1/knowledge-bases/{kb.pk}", {"name": "renamed"}, format="json"
    )
    assert response.status_code == 200 and response.json()["name"] == "renamed"
    assert alice_client.delete(f"/api/v1/knowledge-bases/{kb.pk}").status_code == 204
    assert not KnowledgeBase.objects.exists() and not Chunk.objects.exists()


def test_ingest_through_api_then_reingest_is_idempotent(alice, alice_client):
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    first = alice_client.post(url, _docs("cats purr", "dogs bark", session_id="s1"), format="json")
    assert first.status_code == 201
    assert first.json()["chunks_written"] == 2
    assert (first.json()["knowledge_base"], first.json()["chunks"]) == (str(kb.pk), 2)
    ids = sorted(Chunk.objects.values_list("id", flat=True))
    again = alice_client.post(url, _docs("cats purr", "dogs bark", session_id="s1"), format="json")
    assert again.status_code == 201
    assert sorted(Chunk.objects.values_list("id", flat=True)) == ids


def test_documents_without_source_key_are_keyed_by_content(alice, alice_client):
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}/documents"
    for _ in range(2):
        alice_client.post(url, {"documents": [{"text": "same text"}]}, format="json")
    assert Chunk.objects.filter(knowledge_base=kb).count() == 1


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"documents": []},
        {"documents": [{"text": "   "}]},
        {"documents": [{"text": "ok", "source_key": "a"}, {"text": "ok2", "source_key": "a"}]},
        {"documents": [{"text": "ok", "metadata": "not an object"}]},
        {"documents": [{"text": "ok", "metadata": {"timestamp": "someday"}}]},
    ],
)
def test_ingest_bad_input_is_400_and_stores_nothing(alice, alice_client, payload):
    kb = make_kb(alice)
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", payload, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()["error"]) == ERR_KEYS
    assert not Chunk.objects.exists()


def test_oversized_document_is_400(alice, alice_client, settings):
    settings.INGEST_MAX_DOCUMENT_CHARS = 100
    kb = make_kb(alice)
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", _docs("x" * 101), format="json"
    )
    assert response.status_code == 400
    assert not Chunk.objects.exists()


def test_too_many_documents_is_400(alice, alice_client, settings):
    settings.INGEST_MAX_DOCUMENTS = 2
    kb = make_kb(alice)
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/documents", _docs("a", "b", "c"), format="json"
    )
    assert response.status_code == 400
    assert not Chunk.objects.exists()


# --- tenancy ------------------------------------------------------------------------
def test_other_tenant_gets_404_everywhere_and_nothing_changes(alice, bob_client, anon_client):
    kb = make_kb(alice)
    ingest(kb, ("a", "alice's secret about cats"))
    base = f"/api/v1/knowledge-bases/{kb.pk}"
    for client, expected in ((bob_client, 404), (anon_client, 401)):
        assert client.get(base).status_code == expected
        assert client.patch(base, {"name": "stolen"}, format="json").status_code == expected
        assert client.delete(base).status_code == expected
        assert (
            client.post(base + "/documents", _docs("injected"), format="json").status_code
            == expected
        )
        assert (
            client.post(base + "/search", {"query": "cats"}, format="json").status_code == expected
        )
        assert client.get(base + "/chunks").status_code == expected
        assert (
            client.post(
                "/api/v1/search",
                {"query": "cats", "knowledge_base_ids": [str(kb.pk)]},
                format="json",
            ).status_code
            == expected
        )
    kb.refresh_from_db()
    assert kb.name == "notes"
    assert list(Chunk.objects.values_list("text", flat=True)) == ["alice's secret about cats"]
    assert bob_client.get("/api/v1/knowledge-bases").json()["count"] == 0
    assert bob_client.post("/api/v1/search", {"query": "cats"}, format="json").json() == {
        "results": []
    }


# --- search -------------------------------------------------------------------------
def test_search_returns_hits_with_components(alice, alice_client):
    kb = make_kb(alice)
    ingest(kb, ("a", "The user loves hiking in the Alps"), ("b", "Quarterly revenue report"))
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/search",
        {"query": "hiking alps", "top_k": 2},
        format="json",
    )
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["text"] for r in results] == [
        "The user loves hiking in the Alps",
        "Quarterly revenue report",
    ]
    top = results[0]
    assert top["vector_rank"] == 1 and top["keyword_rank"] == 1
    # Weighted fusion: first in both legs (1.0 each after min-max scaling: 0.4 + 0.6); "b"
    # is last in the vector leg (0) and missing from the keyword leg. Two documents lend
    # each other no context (issue 25: it once scored 0.5, half of "a"'s).
    assert top["score"] == pytest.approx(1.0)
    assert results[1]["score"] == 0.0
    assert results[1]["keyword_rank"] is None and results[1]["vector_rank"] == 2
    assert top["metadata"]["source_key"] == "a#0"
    assert top["knowledge_base"] == str(kb.pk)
    assert "embedding" not in top


def test_keyword_and_vector_modes(alice, alice_client):
    kb = make_kb(alice)
    ingest(kb, ("a", "postgres vector search"), ("b", "cooking pasta at home"))
    url = f"/api/v1/knowledge-bases/{kb.pk}/search"
    keyword = alice_client.post(url, {"query": "pasta", "mode": "keyword"}, format="json").json()[
        "results"
    ]
    assert [r["text"] for r in keyword] == ["cooking pasta at home"]
    assert keyword[0]["vector_score"] is None
    vector = alice_client.post(
        url, {"query": "vector search in postgres", "mode": "vector", "top_k": 1}, format="json"
    ).json()["results"]
    assert [r["text"] for r in vector] == ["postgres vector search"]
    assert vector[0]["score"] == pytest.approx(vector[0]["vector_score"])


def test_search_with_explicit_vector_and_threshold(alice, alice_client):
    from knowledge.selectors import kb_embedder

    kb = make_kb(alice)
    ingest(kb, ("a", "alpha beta gamma"), ("b", "completely different words"))
    vec = [float(x) for x in kb_embedder(kb).embed(["alpha beta gamma"])[0]]
    url = f"/api/v1/knowledge-bases/{kb.pk}/search"
    results = alice_client.post(
        url, {"vector": vec, "mode": "vector", "similarity_threshold": 0.99}, format="json"
    ).json()["results"]
    assert [r["text"] for r in results] == ["alpha beta gamma"]
    assert results[0]["vector_score"] == pytest.approx(1.0, abs=1e-5)


def test_filters_narrow_results(alice, alice_client):
    kb = make_kb(alice)
    ingest(
        kb,
        ("a", "note one", {"session_id": "s1", "timestamp": "2026-01-01T00:00:00Z"}),
        ("b", "note two", {"session_id": "s2", "timestamp": "2026-02-01T00:00:00Z"}),
        (
            "c",
            "note three",
            {"session_id": "s1", "timestamp": "2026-03-01T00:00:00Z", "source_type": "file"},
        ),
    )
    url = f"/api/v1/knowledge-bases/{kb.pk}/search"

    def texts(filters):
        body = {"query": "note", "filters": filters, "top_k": 10}
        return sorted(
            r["text"] for r in alice_client.post(url, body, format="json").json()["results"]
        )

    assert texts({"session_id": "s1"}) == ["note one", "note three"]
    assert texts({"session_id": "s1", "source_type": "file"}) == ["note three"]
    assert texts({"since": "2026-01-15T00:00:00Z"}) == ["note three", "note two"]
    assert texts({"since": "2026-01-15T00:00:00Z", "until": "2026-02-15T00:00:00Z"}) == ["note two"]
    assert texts({"session_id": "nope"}) == []


def test_temporal_decay_prefers_recent(alice, alice_client):
    kb = make_kb(alice)
    ingest(
        kb,
        ("old", "favourite colour is blue", {"timestamp": "2020-01-01T00:00:00Z"}),
        ("new", "favourite colour is blue!", {"timestamp": "2026-11-01T00:00:00Z"}),
    )
    url = f"/api/v1/knowledge-bases/{kb.pk}/search"
    body = {"query": "favourite colour is blue", "mode": "vector", "half_life_days": 30}
    results = alice_client.post(url, body, format="json").json()["results"]
    assert [r["metadata"]["source_key"] for r in results] == ["new#0", "old#0"]
    assert results[1]["score"] < results[1]["vector_score"] * 0.001


def test_default_multi_search_leaves_out_memory_bases(alice, alice_client):
    kb = make_kb(alice, name="kb")
    mb = make_kb(alice, name="mb", is_memory_base=True)
    ingest(kb, ("a", "shared topic from the knowledge base"))
    ingest(mb, ("a", "shared topic from the memory base"))

    def search(**extra):
        body = {"query": "shared topic", **extra}
        return sorted(
            r["text"]
            for r in alice_client.post("/api/v1/search", body, format="json").json()["results"]
        )

    assert search() == ["shared topic from the knowledge base"]
    assert search(include_memory_bases=True) == [
        "shared topic from the knowledge base",
        "shared topic from the memory base",
    ]
    assert search(knowledge_base_ids=[str(mb.pk)]) == ["shared topic from the memory base"]


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"query": ""},
        {"query": "   "},
        {"query": "x", "top_k": 0},
        {"query": "x", "top_k": 101},
        {"query": "x", "mode": "fuzzy"},
        {"vector": [0.1, 0.2], "mode": "keyword"},
        {"query": "x", "filters": {"colour": "red"}},
        {"query": "x", "filters": {"since": "not a date"}},
        {"query": "x", "similarity_threshold": 2},
    ],
)
def test_search_bad_input_is_400(alice, alice_client, payload):
    kb = make_kb(alice)
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/search", payload, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]) == ERR_KEYS


def test_wrong_vector_dimension_is_400(alice, alice_client):
    kb = make_kb(alice)
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/search",
        {"vector": [0.1] * 3, "mode": "vector"},
        format="json",
    )
    assert response.status_code == 400
    assert "384" in response.json()["error"]["message"]


def test_unknown_base_is_404(alice_client):
    response = alice_client.post(
        "/api/v1/knowledge-bases/00000000-0000-0000-0000-000000000000/search",
        {"query": "x"},
        format="json",
    )
    assert response.status_code == 404
    assert (
        alice_client.post(
            "/api/v1/search",
            {"query": "x", "knowledge_base_ids": ["00000000-0000-0000-0000-000000000000"]},
            format="json",
        ).status_code
        == 404
    )


def test_list_query_counts_are_constant(alice, alice_client, django_assert_num_queries):
    for i in range(5):
        make_kb(alice, name=f"kb{i}")
    alice_client.get("/api/v1/me")  # the key's first use records last_used_at
    # key lookup, count, page: the same for 5 bases as for 500
    with django_assert_num_queries(3):
        response = alice_client.get("/api/v1/knowledge-bases")
    assert response.json()["count"] == 5


def test_chunk_listing(alice, alice_client):
    kb = make_kb(alice)
    ingest(kb, ("a", "first"), ("b", "second"))
    body = alice_client.get(f"/api/v1/knowledge-bases/{kb.pk}/chunks").json()
    assert [c["text"] for c in body["results"]] == ["first", "second"]
    assert "embedding" not in body["results"][0]


def test_search_naming_rrf_k_fuses_by_reciprocal_rank(alice, alice_client):
    kb = make_kb(alice)
    ingest(kb, ("a", "The user loves hiking in the Alps"), ("b", "Quarterly revenue report"))
    response = alice_client.post(
        f"/api/v1/knowledge-bases/{kb.pk}/search",
        {"query": "hiking alps", "top_k": 2, "rrf_k": 10},
        format="json",
    )
    top, second = response.json()["results"]
    assert (top["vector_rank"], top["keyword_rank"]) == (1, 1)
    # 1/(k+1) from each leg; 1/(k+2) from the vector leg (no context between documents).
    assert top["score"] == pytest.approx(2 / 11)
    assert second["score"] == pytest.approx(1 / 12)


@pytest.mark.django_db(transaction=True)
def test_a_memory_bases_knowledge_base_is_read_only_here(alice, alice_client, flow):
    """A document sent to a memory base's knowledge base took the place of a captured turn
    (``source_key: message:3``), and PATCH renamed it: both 409 now, nothing changed."""
    from memories.bases.services import memory_base_create, messages_record
    from memories.conversations.services import MessageIn

    memory_base = memory_base_create(owner=alice, name="shop", flow=flow, threshold=1)
    [turn] = messages_record(flow=flow, session_id="order-77", run_id="r",
                             messages=[MessageIn(role="assistant", text="It arrives Thursday.")])  # fmt: skip
    kb = memory_base.knowledge_base
    before = list(kb.chunks.values_list("source_key", "text", "session_id"))
    assert before == [(f"message:{turn.pk}#0", "It arrives Thursday.", "order-77")]
    url = f"/api/v1/knowledge-bases/{kb.pk}"
    body = {"documents": [{"text": "injected", "source_key": f"message:{turn.pk}"}]}
    response = alice_client.post(f"{url}/documents", body, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "read_only"
    assert "memory base's" in response.json()["error"]["message"]
    response = alice_client.patch(url, {"name": "renamed"}, format="json")
    assert response.status_code == 409, response.content
    kb.refresh_from_db()
    assert kb.name == "Memory: shop"
    assert list(kb.chunks.values_list("source_key", "text", "session_id")) == before
    # a search still reads it
    assert (
        alice_client.post(f"{url}/search", {"query": "Thursday"}, format="json").status_code == 200
    )

    # a base of one's own: written and renamed as before
    own = make_kb(alice, name="own")
    assert alice_client.patch(f"/api/v1/knowledge-bases/{own.pk}", {"name": "mine"},
                              format="json").status_code == 200  # fmt: skip


@pytest.mark.parametrize(
    ("documents", "said"),
    [
        ([{"text": "same"}, {"text": "other"}, {"text": "same"}],
         "documents: Documents 0 and 2 have the same text and no source_key: send it once, or "
         "give each a source_key."),
        ([{"text": "a", "source_key": "k"}, {"text": "b", "source_key": "k"}],
         "documents: Documents 0 and 1 have the same source_key."),
    ],
)  # fmt: skip
def test_two_documents_of_one_key_in_a_batch_are_named(alice, alice_client, documents, said):
    """Two documents without a source_key and with the same text were refused for
    "source_key values", a field the client never sent."""
    kb = make_kb(alice)
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents",
                                 {"documents": documents}, format="json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["message"] == said
    assert not Chunk.objects.exists()


@pytest.mark.parametrize("session", ["bad id with spaces", "   ", "-starts-with-a-dash"])
def test_a_documents_session_id_is_a_session_id(alice, alice_client, session):
    """Any text was taken: chunks that a search can filter by, but no session route can
    name."""
    kb = make_kb(alice)
    body = {"documents": [{"text": "t", "metadata": {"session_id": session}}]}
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"].startswith(
        "documents[0].metadata.session_id: must be 1-255 characters"
    )
    assert not Chunk.objects.exists()


def test_a_documents_metadata_may_not_use_a_hits_own_keys(alice, alice_client):
    """``metadata: {"source_key": "override"}`` was stored, listed, and replaced in every
    search hit by the chunk's own: the client's value silently hidden."""
    kb = make_kb(alice)
    body = {"documents": [{"text": "t", "metadata": {"source_key": "x", "chunk_index": 3}}]}
    response = alice_client.post(f"/api/v1/knowledge-bases/{kb.pk}/documents", body, format="json")
    assert response.status_code == 400, response.content
    details = response.json()["error"]["details"]["documents"]["0"]["metadata"]
    assert sorted(details) == ["chunk_index", "source_key"]
    assert not Chunk.objects.exists()
