"""Export and import of an owner's facts with their history (issue 27): a documented,
versioned JSON Lines file; an import is idempotent, all or nothing, re-embeds when the
file has no vectors, and can rename scopes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
from django.core.management import call_command

from memories.facts.models import Fact, FactLink, FactVersion, Scope
from memories.facts.scopes import global_scope_ensure
from memories.facts.services import FactIn, fact_add, fact_delete, fact_update
from tests.memories.engine.scripted import engine_storage  # noqa: F401

pytestmark = pytest.mark.django_db
MARCH = datetime(2026, 3, 1, tzinfo=UTC)


def _populate(owner) -> None:
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


def _export(client, **params) -> list[dict]:
    response = client.get("/api/v1/export", params)
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def _import(client, lines, **params):
    body = "\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines)
    return client.post("/api/v1/import" + ("?" + "&".join(f"{k}={v}" for k, v in params.items())
                       if params else ""), body, content_type="application/x-ndjson")  # fmt: skip


def _without_ids(lines: list[dict]) -> list[dict]:
    out = []
    for line in lines[1:]:
        line = {k: v for k, v in line.items() if k not in ("id", "fact_id", "successor")}
        out.append(line)
    return sorted(out, key=lambda x: json.dumps(x, sort_keys=True))


def test_round_trip_into_an_empty_owner(alice, bob, alice_client, bob_client):
    _populate(alice)
    first = _export(alice_client)
    schema = json.loads(
        (Path(__file__).resolve().parents[3] / "docs" / "export-format.json").read_text()
    )
    for line in first:  # every line as the documented schema says
        jsonschema.validate(line, schema)
    header = first[0]
    assert (header["format"], header["version"], header["vectors"]) == ("memory-export", 1, True)
    kinds = [line["type"] for line in first[1:]]
    assert kinds.count("scope") == 3 and kinds.count("fact") == 4 and kinds.count("version") == 3
    imported = _import(bob_client, first)
    assert imported.status_code == 200, imported.content
    assert imported.json() == {"scopes": 3, "facts": 4, "versions": 3, "embedded": 0, "lines": 11}
    second = _export(bob_client)
    assert _without_ids(second) == _without_ids(first)
    # The lineage survives with new ids: Porto's history reads Lisbon, then Porto.
    porto = Fact.objects.get(owner=bob, content="User lives in Porto")
    versions = bob_client.get(f"/api/v1/engine/facts/{porto.pk}/history").json()["versions"]
    assert [v["content"] for v in versions] == ["User lives in Lisbon", "User lives in Porto"]
    assert versions[0]["valid_to"] == "2026-03-01T00:00:00Z"
    assert not Fact.objects.filter(owner=bob, pk__in=Fact.objects.filter(owner=alice)).exists()
    # Twice: nothing new.
    again = _import(bob_client, first).json()
    assert again == {"scopes": 0, "facts": 0, "versions": 0, "embedded": 0, "lines": 11}
    assert (Fact.objects.filter(owner=bob).count(), FactVersion.objects.filter(owner=bob).count(),
            Scope.objects.filter(owner=bob).count()) == (4, 3, 3)  # fmt: skip


def test_without_vectors_the_import_embeds_the_texts(alice, bob, alice_client, bob_client):
    _populate(alice)
    lines = _export(alice_client, vectors="false")
    assert not any("embedding" in line for line in lines[1:])
    report = _import(bob_client, lines).json()
    assert report["embedded"] == 7 and report["facts"] == 4
    alice_vectors = {f.content: list(f.embedding) for f in Fact.objects.filter(owner=alice)}
    for fact in Fact.objects.filter(owner=bob):
        assert list(fact.embedding) == pytest.approx(alice_vectors[fact.content], abs=1e-6)


def test_scope_map_renames_an_end_user(alice, bob, alice_client, bob_client):
    _populate(alice)
    lines = _export(alice_client)
    report = _import(bob_client, lines, scope_map=json.dumps({"user/alice": "user/ann"}))
    assert report.status_code == 200
    ann = Scope.objects.get(owner=bob, path=["user", "ann"])
    assert ann.external_id == "ann"
    assert sorted(FactLink.objects.filter(scope=ann).values_list("fact__content", flat=True)) == [
        "User drinks green tea", "User lives in Porto",
    ]  # fmt: skip
    assert not Scope.objects.filter(owner=bob, path=["user", "alice"]).exists()


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda lines: [{"format": "memory-export", "version": 2}, *lines[1:]], "line 1"),
        (lambda lines: [*lines[:5], json.dumps(lines[5])[:40], *lines[6:]], "line 6"),
        (lambda lines: [*lines[:4], {**lines[4], "embedding": [0.1, 0.2]}, *lines[5:]], "line 5"),
        (lambda lines: [*lines[:4], {**lines[4], "category": "gossip"}, *lines[5:]], "line 5"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_written(alice, bob, alice_client, bob_client,
                                                    change, where):  # fmt: skip
    _populate(alice)
    lines = _export(alice_client)
    response = _import(bob_client, change(lines))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_import" and error["message"].startswith(where)
    assert not Scope.objects.filter(owner=bob).exists()
    assert not Fact.objects.filter(owner=bob).exists()


def test_a_scope_map_that_merges_two_scopes_is_refused(alice, bob, alice_client, bob_client):
    _populate(alice)
    lines = _export(alice_client)
    merged = json.dumps({"user/alice": "team/x", "org/acme": "team/x"})
    response = _import(bob_client, lines, scope_map=merged)
    assert response.status_code == 400 and "scope_map" in response.json()["error"]["details"]
    assert not Scope.objects.filter(owner=bob).exists()


def test_the_commands_export_and_import(alice, bob, tmp_path, capsys):
    _populate(alice)
    path = tmp_path / "alice.jsonl"
    call_command("export_memory", "alice", "--output", str(path))
    assert len(path.read_text().splitlines()) == 11
    call_command("import_memory", "bob", str(path), "--scope-map", "org/acme=org/globex")
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["facts"] == 4
    assert Scope.objects.filter(owner=bob, path=["org", "globex"]).exists()
    call_command("import_memory", "bob", str(path), "--scope-map", "org/acme=org/globex")
    assert json.loads(capsys.readouterr().out.strip())["facts"] == 0


def test_the_export_holds_only_the_callers_data(alice, bob, bob_client):
    _populate(alice)
    lines = _export(bob_client)
    assert len(lines) == 1  # the header alone
