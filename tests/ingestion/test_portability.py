"""Export and import of everything an owner keeps (issue 27): a documented, versioned JSON
Lines file; an import is idempotent, all or nothing, re-embeds when the file has no
vectors, and can rename scopes. The round trip exports a fully populated owner, imports
it into an empty one, exports again and compares the two files, ids aside."""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from core.providers.embeddings import get_embedder
from knowledge.models import Chunk, KnowledgeBase
from knowledge.services.bases import knowledge_base_create
from knowledge.services.errors import DocumentIn
from knowledge.services.ingest import knowledge_base_ingest
from memories.bases.models import MemoryBase, MemoryBaseSession
from memories.bases.services import memory_base_create, memory_base_session_ensure, messages_record
from memories.conversations.models import ConversationSummary, Flow, Message
from memories.conversations.node_memory.services import (
    node_memory_append_turn,
    node_memory_documents,
)
from memories.conversations.services import MessageIn, flow_create
from memories.engine import files
from memories.facts.models import Fact, FactLink, FactVersion, Scope
from memories.facts.scopes import global_scope_ensure
from memories.facts.services import FactIn, fact_add, fact_delete, fact_update
from memories.facts.tasks import index_pending_facts
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_write
from tests.memories.engine.scripted import engine_storage  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "export-format.json").read_text()
)


@pytest.fixture(autouse=True)
def _files(engine_storage):  # noqa: F811 (journals and MEMORY.md in a temporary directory)
    return engine_storage


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _facts(owner) -> None:
    def add(scope, text, **fields):
        [d] = fact_add(owner=owner, scope=scope, facts=[FactIn(text, **fields)],
                       dedup_threshold=1.01)  # fmt: skip
        return d.fact_id

    lisbon = add(["user", "alice"], "User lives in Lisbon", source_kind="message")
    add(["user", "alice"], "User lives in Porto", source_kind="message", replaces=lisbon,
        valid_from=MARCH)  # fmt: skip
    tea = add(["user", "alice"], "User drinks black tea", category="preference")
    fact_update(owner=owner, fact_id=tea, content="User drinks green tea", reason="corrected")
    gone = add(["user", "alice"], "User has a cat")
    fact_delete(owner=owner, fact_id=gone, reason="wrong")
    add(["org", "acme"], "Acme ships on Fridays", metadata={"team": "ops"})
    fact_add(owner=owner, scope=global_scope_ensure(owner=owner),
             facts=[FactIn("Support answers within a day")])  # fmt: skip


def _populate(owner) -> None:
    """Every kind of memory the owner can keep."""
    _facts(owner)
    kb = knowledge_base_create(owner=owner, name="handbook", chunk_size=200, chunk_overlap=20)
    knowledge_base_ingest(knowledge_base=kb, documents=[
        DocumentIn(text="The API rate limit is 100 requests per minute. " * 6, source_key="limits"),
        DocumentIn(text="Support is open on weekdays.", source_key="support",
                   metadata={"lang": "en"}),
    ])  # fmt: skip
    flow = flow_create(owner=owner, name="support-bot")
    base = memory_base_create(owner=owner, name="support-memory", flow=flow, threshold=50)
    messages_record(flow=flow, session_id="s1", run_id="r1", messages=[
        MessageIn(role="user", text="How do I reset my password?"),
        MessageIn(role="assistant", text="Use the reset link on the sign-in page."),
    ])  # fmt: skip
    knowledge_base_ingest(knowledge_base=base.knowledge_base, documents=[
        DocumentIn(text="Use the reset link on the sign-in page.", source_key="s1:m2",
                   session_id="s1", flow_id=str(flow.pk)),
    ])  # fmt: skip
    session = memory_base_session_ensure(memory_base=base, session_id="s1")
    session.total_processed = 2
    last = Message.objects.filter(flow=flow).order_by("id").last()
    session.cursor_message_id, session.cursor_created_at = last.pk, last.created_at
    session.save()
    node_memory_append_turn(flow=flow, session_id="s1", node_id="agent", message_id="t1",
                            user_content="hi", assistant_content="hello there")  # fmt: skip
    ConversationSummary.objects.create(owner=owner, key=f"flow:{flow.pk}:s1",
                                       text="They asked about passwords.", token_count=5)  # fmt: skip
    memory_config_apply(owner=owner, document={
        "memory": [{"name": "notes", "type": "simple", "config": {}}],
        "nodes": [{"id": "agent", "flow": flow.name, "memories": [{"name": "notes"}]}],
    })  # fmt: skip
    node_memory_write(flow=flow, node_id="agent", input="What plan am I on?",
                      output="You are on the team plan since May.", session_id="s1")  # fmt: skip
    at = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
    files.journal_append(owner_id=owner.pk, scope=["user", "alice"], at=at, source="api",
                         messages=[{"role": "user", "content": "I moved to Porto"}])  # fmt: skip
    files.write_text(files.memory_md_path(owner.pk, ["user", "alice"]), "# Memory\n- Porto\n")


def _export(client, **params) -> list[dict]:
    response = client.get("/api/v1/export", params)
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def _import(client, lines, **params):
    body = "\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines)
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return client.post("/api/v1/import" + query, body, content_type="application/x-ndjson")


def _labels(lines: list[dict]) -> dict[str, str]:
    """Each id of an export named by what it is (its object's name or content)."""
    names: dict[str, str] = {}
    for line in lines[1:]:
        kind = line["type"]
        if kind in ("flow", "knowledge_base", "memory_store", "memory_base"):
            names[line["id"]] = f"{kind}:{line['name']}"
        elif kind == "message":
            names[line["id"]] = f"message:{line['session_id']}:{line['created_at']}:{line['text']}"
        elif kind in ("fact", "version"):
            names[line["id"]] = f"{kind}:{line['content']}:{line['recorded_from']}"
            if kind == "fact":
                names.setdefault(line["id"], names[line["id"]])
    for line in lines[1:]:  # a version's fact: the fact it was
        if line["type"] == "version":
            names.setdefault(line["fact_id"], f"fact of:{line['content']}:{line['recorded_from']}")
    return names


def _named(value, names):
    if isinstance(value, dict):
        return {k: _named(v, names) for k, v in value.items() if k != "owner_id"}
    if isinstance(value, list):
        return [_named(v, names) for v in value]
    if isinstance(value, str):
        if value in names:
            return names[value]
        return UUID.sub(lambda m: names.get(m.group(0), m.group(0)), value)
    return value


def _comparable(lines: list[dict]) -> list[str]:
    names = _labels(lines)
    out = [json.dumps(_named(line, names), sort_keys=True) for line in lines[1:]]
    return sorted(out)


def test_round_trip_of_a_fully_populated_owner(alice, bob, alice_client, bob_client):
    _populate(alice)
    first = _export(alice_client)
    for line in first:  # every line as the documented schema says
        jsonschema.validate(line, SCHEMA)
    assert first[0]["format"] == "memory-export" and first[0]["version"] == 1
    kinds = {}
    for line in first[1:]:
        kinds[line["type"]] = kinds.get(line["type"], 0) + 1
    assert kinds == {
        "knowledge_base": 2, "chunk": 4, "flow": 1, "message": 2, "node_memory": 1,
        "summary": 1, "memory_base": 1, "memory_base_session": 1, "memory_store": 1,
        "store_item": 1, "attachment": 1, "scope": 3, "fact": 4, "version": 3, "journal": 1,
        "memory_md": 1, "end": 1,
    }  # fmt: skip
    assert first[-1] == {"type": "end", "lines": len(first) - 1}
    # The other owner's database is as fresh as this one can be made: nothing of alice's
    # is left when bob imports (her files aside, which are hers by path).
    alice.delete()
    assert not Fact.objects.exists() and not Flow.objects.exists()
    assert not KnowledgeBase.objects.exists() and not MemoryStore.objects.exists()
    imported = _import(bob_client, first)
    assert imported.status_code == 200, imported.content
    assert imported.json() == {
        "flows": 1, "messages": 2, "summaries": 1, "node_memories": 1, "knowledge_bases": 1,
        "memory_bases": 1, "stores": 1, "store_items": 1, "attachments": 1, "chunks": 4,
        "scopes": 3, "facts": 4, "versions": 3, "files": 2, "embedded": 0,
        "lines": len(first),
    }  # fmt: skip
    second = _export(bob_client)
    assert _comparable(second) == _comparable(first)
    # What was imported works: the lineage, the memory base's chunks, the node's store.
    porto = Fact.objects.get(owner=bob, content="User lives in Porto")
    versions = bob_client.get(f"/api/v1/engine/facts/{porto.pk}/history").json()["versions"]
    assert [v["content"] for v in versions] == ["User lives in Lisbon", "User lives in Porto"]
    base = MemoryBase.objects.get(owner=bob)
    assert base.flow.owner == bob and base.knowledge_base.chunks.count() == 1
    cursor = MemoryBaseSession.objects.get(memory_base=base).cursor_message_id
    assert Message.objects.get(pk=cursor).text == "Use the reset link on the sign-in page."
    found = bob_client.post(f"/api/v1/knowledge-bases/{KnowledgeBase.objects.get(owner=bob, name='handbook').pk}/search",
                            {"query": "rate limit", "top_k": 1}, format="json").json()  # fmt: skip
    assert "rate limit" in found["results"][0]["text"]
    assert [d["messages"][-1]["content"] for d in node_memory_documents(flow=base.flow)] == [
        "hello there"
    ]
    # Twice: nothing new.
    again = _import(bob_client, first).json()
    assert {k: v for k, v in again.items() if k != "lines"} == dict.fromkeys(
        [k for k in again if k != "lines"], 0
    )
    assert (Fact.objects.filter(owner=bob).count(), Message.objects.filter(owner=bob).count(),
            Chunk.objects.filter(knowledge_base__owner=bob).count(),
            MemoryItem.objects.filter(store__owner=bob).count()) == (4, 2, 4, 1)  # fmt: skip


def test_without_vectors_the_import_embeds_the_texts(alice, bob, alice_client, bob_client):
    _facts(alice)
    lines = _export(alice_client, vectors="false")
    assert not any("embedding" in line for line in lines[1:])
    report = _import(bob_client, lines).json()
    assert report["embedded"] == 7 and report["facts"] == 4
    alice_vectors = {f.content: list(f.embedding) for f in Fact.objects.filter(owner=alice)}
    for fact in Fact.objects.filter(owner=bob):
        assert list(fact.embedding) == pytest.approx(alice_vectors[fact.content], abs=1e-6)


def test_another_embedding_model_is_embedded_again(alice, bob, alice_client, bob_client):
    _facts(alice)
    lines = _export(alice_client)
    other = [lines[0], *({**line, "embedding_model": "another-model", "embedding": [0.5] * 8}
                         if "embedding" in line else line for line in lines[1:])]  # fmt: skip
    report = _import(bob_client, other).json()
    assert report["embedded"] == 7
    assert {len(f.embedding) for f in Fact.objects.filter(owner=bob)} == {get_embedder().dimensions}


def test_scope_map_renames_an_end_user(alice, bob, alice_client, bob_client):
    _facts(alice)
    lines = _export(alice_client)
    report = _import(bob_client, lines, scope_map=json.dumps({"user/alice": "user/ann"}))
    assert report.status_code == 200
    ann = Scope.objects.get(owner=bob, path=["user", "ann"])
    assert ann.external_id == "ann"
    assert sorted(FactLink.objects.filter(scope=ann).values_list("fact__content", flat=True)) == [
        "User drinks green tea", "User lives in Porto",
    ]  # fmt: skip
    assert not Scope.objects.filter(owner=bob, path=["user", "alice"]).exists()


def test_the_file_again_without_the_map_copies_the_renamed_scope(alice, bob, alice_client,
                                                                  bob_client):  # fmt: skip
    """Imported with ``user/alice`` mapped to ``user/ann``, then again without the map: the
    second import made an empty ``user/alice`` and reported no fact (its facts' ids were
    the mapped ones'). Now a fact placed by the map is a row of its own: without the map
    the file's alice facts come to ``user/alice`` with their history, the scopes the map
    did not touch are not copied twice, and each import again writes nothing."""
    _facts(alice)
    lines = _export(alice_client)
    renamed = json.dumps({"user/alice": "user/ann"})

    def held(path):
        return sorted(FactLink.objects.filter(scope__owner=bob, scope__path=path)
                      .values_list("fact__content", flat=True))  # fmt: skip

    first = _import(bob_client, lines, scope_map=renamed).json()
    assert (first["scopes"], first["facts"], first["versions"]) == (3, 4, 3)
    again = _import(bob_client, lines, scope_map=renamed).json()
    assert (again["scopes"], again["facts"], again["versions"]) == (0, 0, 0)
    ann = {
        f.content: f.pk for f in Fact.objects.filter(owner=bob, links__scope__path=["user", "ann"])
    }

    plain = _import(bob_client, lines).json()
    assert (plain["scopes"], plain["facts"], plain["versions"]) == (1, 2, 3)
    assert held(["user", "alice"]) == held(["user", "ann"]) == [
        "User drinks green tea", "User lives in Porto",
    ]  # fmt: skip
    assert held(["org", "acme"]) == ["Acme ships on Fridays"]  # (not copied twice)
    assert held([]) == ["Support answers within a day"]
    porto = Fact.objects.get(owner=bob, links__scope__path=["user", "alice"],
                             content="User lives in Porto")  # fmt: skip
    assert porto.pk != ann["User lives in Porto"]
    lisbon = FactVersion.objects.get(owner=bob, content="User lives in Lisbon",
                                     scope__path=["user", "alice"])  # fmt: skip
    assert lisbon.successor_id == porto.pk  # the copy's history is the copy's
    assert FactVersion.objects.filter(owner=bob, scope__path=["user", "ann"]).count() == 3
    assert FactVersion.objects.filter(owner=bob, scope__path=["user", "alice"]).count() == 3
    last = _import(bob_client, lines).json()
    assert (last["scopes"], last["facts"], last["versions"]) == (0, 0, 0)
    assert Fact.objects.filter(owner=bob).count() == 6


def test_a_scope_mapped_to_itself_is_not_renamed(alice, bob, alice_client, bob_client):
    """``{"user/alice": "user/alice"}`` imported a second copy of every fact of the scope
    into the same scope: the file with it and without it, or twice, is one import."""
    _facts(alice)
    lines = _export(alice_client)
    same = json.dumps({"user/alice": "user/alice"})
    first = _import(bob_client, lines, scope_map=same).json()
    assert (first["scopes"], first["facts"], first["versions"]) == (3, 4, 3)
    for params in ({}, {"scope_map": same}):
        again = _import(bob_client, lines, **params).json()
        assert (again["scopes"], again["facts"], again["versions"]) == (0, 0, 0)
    assert Fact.objects.filter(owner=bob).count() == 4
    assert FactVersion.objects.filter(owner=bob).count() == 3
    assert sorted(FactLink.objects.filter(scope__owner=bob, scope__path=["user", "alice"])
                  .values_list("fact__content", flat=True)) == [
        "User drinks green tea", "User lives in Porto",
    ]  # fmt: skip


def test_a_scope_map_naming_a_scope_the_file_lacks_is_refused(alice, bob, alice_client,
                                                              bob_client, tmp_path):  # fmt: skip
    """A typo in the map (``user/alcie``) imported everything unrenamed, with 200."""
    _facts(alice)
    lines = _export(alice_client)
    mapping = {"user/alice": "user/ann", "user/alcie": "user/bo"}
    response = _import(bob_client, lines, scope_map=json.dumps(mapping))
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "scope_map: the file has no scope user/alcie"
    assert response.json()["error"]["details"] == {"scope_map": mapping}
    assert _counts(bob) == (0,) * 8
    path = tmp_path / "alice.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    with pytest.raises(CommandError, match="^scope_map: the file has no scope users/alice$"):
        call_command("import_memory", "bob", str(path), "--scope-map", "users/alice=user/ann")
    assert _counts(bob) == (0,) * 8


def _counts(owner) -> tuple[int, ...]:
    return (
        Scope.objects.filter(owner=owner).count(), Fact.objects.filter(owner=owner).count(),
        FactVersion.objects.filter(owner=owner).count(), Flow.objects.filter(owner=owner).count(),
        KnowledgeBase.objects.filter(owner=owner).count(),
        MemoryStore.objects.filter(owner=owner).count(),
        MemoryAttachment.objects.filter(store__owner=owner).count(),
        ConversationSummary.objects.filter(owner=owner).count(),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda lines: [{"format": "memory-export", "version": 2}, *lines[1:]], "line 1"),
        (lambda lines: [*lines[:5], json.dumps(lines[5])[:40], *lines[6:]], "line 6"),
        (lambda lines: [*lines[:-1], {**lines[-1], "type": "gossip"}], None),
        (lambda lines: _first(lines, "fact", {"category": "gossip"}), "fact"),
        (lambda lines: _first(lines, "fact", {"embedding": [0.1, 0.2]}), "fact"),
        # What the database would refuse (a 500 once): NaN, NUL, an interval backwards, a
        # time it stores but cannot read back; and what the API refuses.
        (lambda lines: _first(lines, "fact", {"embedding": [float("nan")] * 384}), "fact"),
        (lambda lines: _first(lines, "fact", {"content": "a\x00b"}), "fact"),
        (lambda lines: _first(lines, "fact", {"metadata": {"k": "a\x00b"}}), "fact"),
        (
            lambda lines: _first(
                lines,
                "fact",
                {
                    "valid_from": "2026-05-01T00:00:00+00:00",
                    "valid_to": "2026-04-01T00:00:00+00:00",
                },
            ),
            "fact",
        ),
        (lambda lines: _first(lines, "fact", {"observed_at": "0001-01-01T00:00:00+14:00"}), "fact"),
        (lambda lines: _first(lines, "fact", {"valid_from": "9999-12-31T23:59:59-05:00"}), "fact"),
        (lambda lines: _first(lines, "fact", {"content": "x" * 2001}), "fact"),
        (lambda lines: _first(lines, "fact", {"metadata": [1, 2]}), "fact"),
        (lambda lines: _first(lines, "message", {"role": "wizard"}), "message"),
        (lambda lines: _first(lines, "chunk", {"knowledge_base": "nope"}), "chunk"),
        (
            lambda lines: _first(lines, "memory_store", {"config": {"max_items": "many"}}),
            "memory_store",
        ),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_written(alice, bob, alice_client, bob_client,
                                                    change, where):  # fmt: skip
    _populate(alice)
    lines = _export(alice_client)
    changed = change(lines)
    response = _import(bob_client, changed)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_import"
    number = error["details"]["line"]
    if where is None:
        assert number == len(lines)
    elif where.startswith("line"):
        assert error["message"].startswith(where)
    else:
        assert changed[number - 1]["type"] == where
    assert _counts(bob) == (0,) * 8
    assert not Message.objects.filter(owner=bob).exists()


@pytest.mark.parametrize("kind", ["fact", "version", "chunk", "store_item"])
@pytest.mark.parametrize("component", [0.0, 1e-200])  # (1e-200: its square is 0 in float64)
def test_an_all_zero_vector_is_refused_and_nothing_is_written(
    alice, bob, alice_client, bob_client, kind, component
):
    """A zero vector has no direction: imported, it made every search over its data a
    500 (cosine distances NaN, "Out of range float values are not JSON compliant")."""
    _populate(alice)
    lines = _export(alice_client)
    changed = _first(lines, kind, {"embedding": [component] * 384})
    number = next(i for i, line in enumerate(changed, start=1) if line.get("type") == kind)
    if component == 0:  # (as the schema says: what float4 makes zero, it cannot)
        with pytest.raises(jsonschema.ValidationError, match="does not contain items"):
            jsonschema.validate(changed[number - 1]["embedding"], SCHEMA["$defs"]["vector"])
    response = _import(bob_client, changed)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == {
        "code": "invalid_import",
        "message": f"line {number}: embedding: The vector is all zeros: it has no direction "
                   "to search by.",
        "details": {"line": number, "error": ["embedding: The vector is all zeros: it has no "
                                              "direction to search by."]},
    }  # fmt: skip
    assert _counts(bob) == (0,) * 8
    assert not Message.objects.filter(owner=bob).exists()
    assert not Chunk.objects.filter(knowledge_base__owner=bob).exists()
    assert not MemoryItem.objects.filter(store__owner=bob).exists()


def _first(lines, kind, values):
    out, done = [], False
    for line in lines:
        if not done and isinstance(line, dict) and line.get("type") == kind:
            line, done = {**line, **values}, True
        out.append(line)
    return out


def test_names_the_owner_already_uses_are_refused(alice, bob, alice_client, bob_client):
    _populate(alice)
    flow_create(owner=bob, name="support-bot")
    before = _counts(bob)
    response = _import(bob_client, _export(alice_client))
    assert response.status_code == 400
    assert "already exists" in response.json()["error"]["message"]
    assert _counts(bob) == before


@pytest.mark.parametrize(
    "mapping",
    [{"user/alice": "team/x", "org/acme": "team/x"}, {"user/alice": "org/acme"}],
)
def test_a_scope_map_that_merges_two_scopes_is_refused(alice, bob, alice_client, bob_client,
                                                      mapping):  # fmt: skip
    _facts(alice)
    lines = _export(alice_client)
    response = _import(bob_client, lines, scope_map=json.dumps(mapping))
    assert response.status_code == 400 and "scope_map" in response.json()["error"]["details"]
    assert not Scope.objects.filter(owner=bob).exists()


def _refused_at(response, line: int, why: str) -> None:
    """A 400 ``invalid_import`` naming ``line`` and why, in the error shape."""
    assert response.status_code == 400, response.content
    assert response.json()["error"] == {"code": "invalid_import", "message": f"line {line}: {why}",
                                        "details": {"line": line, "error": [why]}}  # fmt: skip


@pytest.mark.parametrize("names", ["a later line", "no line"])
def test_a_parent_naming_no_earlier_message_line_is_refused(alice, bob, alice_client, bob_client,
                                                            names):  # fmt: skip
    """It was imported with no parent, silently, as the docs said it would not be."""
    _populate(alice)
    lines = _export(alice_client)
    first, second = (i for i, line in enumerate(lines) if line.get("type") == "message")
    parent = lines[second]["id"] if names == "a later line" else "999999"
    changed = [*lines[:first], {**lines[first], "parent": parent}, *lines[first + 1 :]]
    response = _import(bob_client, changed)
    _refused_at(response, first + 1, f"parent {parent} is not a message line before it")
    assert _counts(bob) == (0,) * 8
    assert not Message.objects.filter(owner=bob).exists()


def test_a_parent_naming_an_earlier_message_line_is_kept(alice, bob, alice_client, bob_client):
    _populate(alice)
    lines = _export(alice_client)
    first, second = (i for i, line in enumerate(lines) if line.get("type") == "message")
    changed = [
        *lines[:second],
        {**lines[second], "parent": lines[first]["id"]},
        *lines[second + 1 :],
    ]
    assert _import(bob_client, changed).json()["messages"] == 2
    answer = Message.objects.get(owner=bob, role="assistant")
    assert answer.parent == Message.objects.get(owner=bob, role="user")


def test_two_fact_lines_of_one_id_are_refused(alice, bob, alice_client, bob_client):
    """The second was dropped (its id taken), after being embedded, with 200."""
    _facts(alice)
    lines = _export(alice_client)
    first, *_ = (i for i, line in enumerate(lines) if line.get("type") == "fact")
    twin = {**lines[first], "content": "User lives in Faro"}
    changed = [
        *lines[: first + 1],
        twin,
        *lines[first + 1 : -1],
        {"type": "end", "lines": len(lines)},
    ]
    response = _import(bob_client, changed)
    _refused_at(response, first + 2, f"id {twin['id']} is the fact of line {first + 1} too")
    assert _counts(bob) == (0,) * 8


@pytest.mark.parametrize(
    ("kind", "name"),
    [("fact", "recorded_from"), ("fact", "created_at"), ("fact", "observed_at"),
     ("version", "recorded_from"), ("version", "recorded_to")],
)  # fmt: skip
def test_a_time_recorded_in_the_future_is_refused(alice, bob, alice_client, bob_client, kind,
                                                  name):  # fmt: skip
    """A fact recorded from 2099 was imported, then invisible to every ``as_of`` read."""
    _facts(alice)
    lines = _export(alice_client)
    changed = _first(lines, kind, {name: "2099-01-01T00:00:00Z"})
    number = next(i for i, line in enumerate(changed, start=1) if line.get("type") == kind)
    response = _import(bob_client, changed)
    _refused_at(response, number, f"{name} is in the future")
    assert _counts(bob) == (0,) * 8


def test_a_clock_a_little_ahead_is_no_future(alice, bob, alice_client, bob_client):
    _facts(alice)
    lines = _export(alice_client)
    ahead = (timezone.now() + timedelta(minutes=2)).isoformat()
    changed = _first(lines, "fact", {"recorded_from": ahead, "created_at": ahead,
                                     "observed_at": ahead})  # fmt: skip
    assert _import(bob_client, changed).json()["facts"] == 4
    assert Fact.objects.filter(owner=bob, recorded_at=datetime.fromisoformat(ahead)).count() == 1


SAM = "/api/v1/users/sam/memories"


def _read(response) -> list[tuple[str, str]]:
    return [(f["id"], f["content"]) for f in response.json()["results"]]


@pytest.mark.parametrize("change", ["edit", "delete", "replace"])
def test_a_newer_export_brings_the_sources_edit_or_deletion(alice, bob, alice_client,
                                                            bob_client, change):  # fmt: skip
    """The source edited, deleted or replaced a fact after the copy imported it: the newer
    file answered 200 with the fact unchanged and the version closing it written too (the
    history showed it twice, reads in time the same id twice; a deleted fact stayed
    current). Now the copy follows the file, and the file again, or the older file after
    it, writes nothing."""
    [added] = fact_add(owner=alice, scope=["user", "sam"], facts=[FactIn("User lives in Porto")],
                       dedup_threshold=1.01)  # fmt: skip
    older = _export(alice_client)
    assert _import(bob_client, older).json()["facts"] == 1
    [copy] = Fact.objects.filter(owner=bob)
    between = timezone.now().isoformat()
    if change == "edit":
        edit = {"content": "User lives in Porto, Portugal"}
        response = alice_client.patch(f"{SAM}/{added.fact_id}", edit, format="json")
        assert response.status_code == 200, response.content
    elif change == "delete":
        assert alice_client.delete(f"{SAM}/{added.fact_id}").status_code == 204
    else:
        fact_add(owner=alice, scope=["user", "sam"], dedup_threshold=1.01,
                 facts=[FactIn("User lives in Braga", replaces=added.fact_id)])  # fmt: skip
    newer = _export(alice_client)
    report = _import(bob_client, newer).json()
    assert (report["facts"], report["versions"]) == ((0, 1) if change == "delete" else (1, 1))
    now = {"edit": ["User lives in Porto, Portugal"], "delete": [],
           "replace": ["User lives in Braga"]}[change]  # fmt: skip
    current = list(Fact.objects.filter(owner=bob).values_list("pk", flat=True))
    if change == "edit":
        assert current == [copy.pk]  # (the same fact, edited)

    def same_as_the_source():
        assert _comparable(_export(bob_client)) == _comparable(newer)
        assert _read(bob_client.get(SAM)) == [(str(pk), c) for pk, c in zip(current, now)]
        assert _read(bob_client.get(SAM, {"as_of": between})) == [
            (str(copy.pk), "User lives in Porto")
        ]
        versions = bob_client.get(f"/api/v1/engine/facts/{copy.pk}/history").json()["versions"]
        assert [v["content"] for v in versions] == ["User lives in Porto", *now]
        assert FactVersion.objects.filter(owner=bob).count() == 1
        assert list(Fact.objects.filter(owner=bob).values_list("content", flat=True)) == now

    same_as_the_source()
    for lines in (newer, older):
        again = _import(bob_client, lines).json()
        assert {k: v for k, v in again.items() if k != "lines"} == dict.fromkeys(
            [k for k in again if k != "lines"], 0
        )
        same_as_the_source()


def test_a_change_made_in_the_copy_is_kept_when_a_newer_export_arrives(alice, bob,
                                                                       alice_client, bob_client):  # fmt: skip
    """The copy's own edit closed the state the source's edit closes too: the file's
    version of it is not written (the history would hold one state twice), and the copy's
    text stays."""
    [added] = fact_add(owner=alice, scope=["user", "sam"], facts=[FactIn("User lives in Porto")],
                       dedup_threshold=1.01)  # fmt: skip
    assert _import(bob_client, _export(alice_client)).json()["facts"] == 1
    [copy] = Fact.objects.filter(owner=bob)
    between = timezone.now().isoformat()
    edit = {"content": "User lives in Braga"}
    assert bob_client.patch(f"{SAM}/{copy.pk}", edit, format="json").status_code == 200
    edit = {"content": "User lives in Porto, Portugal"}
    assert alice_client.patch(f"{SAM}/{added.fact_id}", edit, format="json").status_code == 200
    report = _import(bob_client, _export(alice_client)).json()
    assert (report["facts"], report["versions"]) == (0, 0)
    assert _read(bob_client.get(SAM)) == [(str(copy.pk), "User lives in Braga")]
    assert _read(bob_client.get(SAM, {"as_of": between})) == [(str(copy.pk), "User lives in Porto")]
    versions = bob_client.get(f"/api/v1/engine/facts/{copy.pk}/history").json()["versions"]
    assert [v["content"] for v in versions] == ["User lives in Porto", "User lives in Braga"]


def test_the_commands_export_and_import(alice, bob, tmp_path, capsys):
    _facts(alice)
    path = tmp_path / "alice.jsonl"
    call_command("export_memory", "alice", "--output", str(path))
    assert len(path.read_text().splitlines()) == 12  # (the header, 10 lines, the end line)
    call_command("import_memory", "bob", str(path), "--scope-map", "org/acme=org/globex")
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["facts"] == 4
    assert Scope.objects.filter(owner=bob, path=["org", "globex"]).exists()
    call_command("import_memory", "bob", str(path), "--scope-map", "org/acme=org/globex")
    assert json.loads(capsys.readouterr().out.strip())["facts"] == 0


def test_the_commands_say_in_one_line_what_they_cannot_read_or_write(alice, bob, tmp_path):
    """Each was a traceback (audit of the commands, 2026-11-27)."""
    _facts(alice)
    binary = tmp_path / "photo.jpg"
    binary.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    with pytest.raises(CommandError, match=f"^{binary} is not UTF-8 text: nothing imported$"):
        call_command("import_memory", "bob", str(binary))
    assert not Scope.objects.filter(owner=bob).exists()
    missing = tmp_path / "no" / "such" / "dir.jsonl"
    with pytest.raises(CommandError, match=f"^cannot write {missing}: No such file or directory$"):
        call_command("export_memory", "alice", "--output", str(missing))
    with pytest.raises(CommandError, match=f"^cannot write {tmp_path}: Is a directory$"):
        call_command("export_memory", "alice", "--output", str(tmp_path))


def test_an_export_to_a_reader_that_leaves_early_ends_without_a_traceback(
    alice, tmp_path, monkeypatch
):
    """``export_memory alice | head -1``: a BrokenPipeError traceback on stderr. Now
    stdout goes to /dev/null (nothing more is said into the closed pipe) and the
    command ends with status 1."""
    _facts(alice)
    sink = (tmp_path / "fd").open("w")

    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return sink.fileno()

    monkeypatch.setattr(sys, "stdout", Closed())
    with pytest.raises(SystemExit) as ended:
        call_command("export_memory", "alice")
    assert ended.value.code == 1
    sink.close()


@pytest.mark.parametrize("scale", [1e20, 1e-10, 1e-30])  # (1e-30: its square is 0 in float4)
def test_a_vector_far_from_unit_length_is_scaled_to_it(alice, bob, alice_client, bob_client,
                                                       scale):  # fmt: skip
    """1e20 x a vector imported with a 200, then the indexer failed on its 16-bit copy
    ("out of range for type halfvec"); 1e-10 x one is zero there (NaN distances)."""
    _facts(alice)
    lines = _export(alice_client)
    first = next(line for line in lines if line.get("type") == "fact")
    scaled = _first(lines, "fact", {"embedding": [x * scale for x in first["embedding"]]})
    assert _import(bob_client, scaled).status_code == 200
    Fact.objects.filter(owner=bob).update(index_pending=True)
    assert index_pending_facts() == 4  # (the 16-bit copies made without an error)
    stored = Fact.objects.get(owner=bob, content=first["content"]).embedding
    assert np.allclose(stored, first["embedding"], atol=1e-6)  # unit length, as it was
    query = {"scope": ["user", "alice"], "query": first["content"]}
    found = bob_client.post("/api/v1/engine/search", query, format="json")
    assert found.status_code == 200 and found.json()["results"][0]["content"] == first["content"]


def test_the_export_holds_only_the_callers_data(alice, bob, bob_client):
    _populate(alice)
    lines = _export(bob_client)
    assert len(lines) == 2  # the header and the end line alone
    assert lines[1] == {"type": "end", "lines": 1}


def test_imported_facts_are_searchable_at_once_then_indexed(alice, bob, alice_client, bob_client):
    _facts(alice)
    _import(bob_client, _export(alice_client))
    # The import left them pending and queued the indexer, which the tests' synchronous
    # queue ran at the commit.
    assert not Fact.objects.filter(index_pending=True).exists()
    Fact.objects.filter(owner=bob).update(index_pending=True)  # a backlog, as on a busy day
    query = {"scope": ["user", "alice"], "query": "where does the user live"}
    before = bob_client.post("/api/v1/engine/search", query, format="json").json()["results"]
    assert before[0]["content"] == "User lives in Porto"
    assert index_pending_facts() == 4
    assert not Fact.objects.filter(index_pending=True).exists()
    after = bob_client.post("/api/v1/engine/search", query, format="json").json()["results"]
    assert [h["id"] for h in after] == [h["id"] for h in before]
    assert index_pending_facts() == 0  # safe to run twice


def test_vectors_is_a_query_boolean_as_every_other(alice, alice_client):
    """``vectors`` takes ``1``/``0`` as the docs say query booleans do; another word is a
    400 naming it in the error shape (its details were the bare value)."""
    _facts(alice)
    assert not any("embedding" in line for line in _export(alice_client, vectors="0")[1:])
    assert any("embedding" in line for line in _export(alice_client, vectors="1")[1:])
    refused = alice_client.get("/api/v1/export", {"vectors": "yes"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["message"], error["details"]) == (
        "vectors: true, false, 1 or 0",
        {"vectors": ["true, false, 1 or 0"]},
    )


@pytest.mark.parametrize("cut", ["the end line", "the last record too"])
def test_an_export_cut_at_a_lines_end_is_refused_and_nothing_is_written(
    alice, bob, alice_client, bob_client, cut
):
    """An export cut at a line's end (a copy stopped, a full disk, ``head``) imported
    what it held and said 200 (an operator's audit): its end line is missing now, and
    the import is all or nothing, as the docs say."""
    _facts(alice)
    lines = _export(alice_client)
    kept = lines[:-1] if cut == "the end line" else lines[:-2]
    before = Fact.objects.filter(owner=bob).count()
    response = _import(bob_client, kept)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_import"
    assert error["message"].endswith("the file ends before its end line: it was cut short")
    assert Fact.objects.filter(owner=bob).count() == before


def test_an_end_line_that_miscounts_or_is_not_last_is_refused(alice, bob, alice_client, bob_client):
    _facts(alice)
    lines = _export(alice_client)
    miscounted = [*lines[:-1], {"type": "end", "lines": len(lines)}]
    assert "the end line counts" in _import(bob_client, miscounted).json()["error"]["message"]
    after = [*lines, lines[1]]
    assert "a line after the end line" in _import(bob_client, after).json()["error"]["message"]
    assert not Fact.objects.filter(owner=bob).exists()
    spaced = [lines[0], "", *lines[1:-1], "  ", lines[-1]]  # (blank lines are not counted)
    assert _import(bob_client, spaced).status_code == 200


def test_an_end_line_with_other_keys_is_refused(alice, bob, alice_client, bob_client):
    """The schema says ``additionalProperties: false``; the import took them."""
    _facts(alice)
    lines = _export(alice_client)
    extra = [*lines[:-1], {**lines[-1], "extra": 1, "checksum": "x"}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(extra[-1], SCHEMA)
    response = _import(bob_client, extra)
    _refused_at(response, len(lines), "the end line has keys other than type and lines: "
                "checksum, extra")  # fmt: skip
    assert _counts(bob) == (0,) * 8


def test_a_byte_order_mark_before_the_header_is_skipped(alice, bob, alice_client, bob_client,
                                                        tmp_path):  # fmt: skip
    """It was refused as "line 1: not a JSON object (a truncated line?)"."""
    _facts(alice)
    lines = _export(alice_client)
    text = "\n".join(json.dumps(line) for line in lines)
    response = bob_client.post("/api/v1/import", ("\ufeff" + text).encode("utf-8"),
                               content_type="application/x-ndjson")  # fmt: skip
    assert response.status_code == 200, response.content
    assert (response.json()["facts"], response.json()["lines"]) == (4, len(lines))
    path = tmp_path / "alice.jsonl"
    path.write_text(text, encoding="utf-8-sig")  # (the mark, as Notepad saves)
    call_command("import_memory", "bob", str(path))
    assert Fact.objects.filter(owner=bob).count() == 4


def test_an_export_made_before_the_end_line_still_imports(alice, bob, alice_client, bob_client):
    _facts(alice)
    lines = _export(alice_client)
    header = {k: v for k, v in lines[0].items() if k != "end_line"}
    response = _import(bob_client, [header, *lines[1:-1]])
    assert response.status_code == 200 and response.json()["facts"] == 4


@pytest.mark.parametrize("kind", ["fact", "chunk", "store_item"])
def test_an_imported_metadata_over_the_apis_size_is_refused(alice, bob, alice_client,
                                                            bob_client, kind):  # fmt: skip
    """The API takes a metadata of at most 16 KiB; an imported file took any size."""
    from core.api.fields import MAX_METADATA_BYTES

    _populate(alice)
    lines = _export(alice_client)
    at = next(i for i, line in enumerate(lines) if line.get("type") == kind)
    lines[at] = {**lines[at], "metadata": {"note": "x" * MAX_METADATA_BYTES}}
    response = _import(bob_client, lines)
    assert response.status_code == 400, response.content
    said = response.json()["error"]["message"]
    assert f"line {at + 1}" in said and "metadata: Ensure this object has no more than" in said
    assert _counts(bob) == (0,) * 8
