"""The declarative config: every bad document refused at its place with nothing written,
YAML and JSON, dry runs, idempotence, export then import, and the management command."""

from __future__ import annotations

import copy
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from memories.stores.models import MemoryItem, MemoryStore
from tests.memories.stores.conftest import seed_config, snapshot_db

pytestmark = pytest.mark.django_db
URL = "/api/v1/memory-config"


@pytest.fixture
def base_doc(flow, docs_root, embed_server):
    return seed_config(embed_server.base_url)


def _mutate(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    target = doc
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if value is KeyError:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return doc


BAD = [
    # (what, path to change, value, place named in the error)
    ("duplicate store name", "memory/2/name", "convo_cache", "memory[2].name"),
    ("unknown type", "memory/0/type", "vector", "memory[0].type"),
    ("unknown config field", "memory/2/config/max_itmes", 5, "memory[2].config.max_itmes"),
    ("bad config value", "memory/2/config/max_items", 0, "memory[2].config.max_items"),
    ("bad max_age", "memory/2/config/max_age", "soon", "memory[2].config.max_age"),
    (
        "literal api key",
        "memory/0/config/embedding/api_key",
        "sk-123",
        "memory[0].config.embedding.api_key",
    ),
    (
        "unknown provider",
        "memory/0/config/embedding/provider",
        "faiss",
        "memory[0].config.embedding.provider",
    ),
    (
        "file outside the roots",
        "memory/1/config/file_sources/0/path",
        "/etc",
        "memory[1].config.file_sources[0].path",
    ),
    (
        "missing file source",
        "memory/1/config/file_sources/0/path",
        "nope/",
        "memory[1].config.file_sources[0].path",
    ),
    ("no file sources", "memory/1/config/file_sources", [], "memory[1].config.file_sources"),
    ("unknown store attached", "nodes/0/memories/0/name", "ghost", "nodes[0].memories[0].name"),
    ("write on a read-only store", "nodes/0/memories/1/write", True, "nodes[0].memories[1].write"),
    (
        "unknown stage",
        "nodes/0/memories/0/retrieve_stage",
        ["gen", "review"],
        "nodes[0].memories[0].retrieve_stage[1]",
    ),
    ("top_k out of range", "nodes/0/memories/0/top_k", 0, "nodes[0].memories[0].top_k"),
    (
        "threshold out of range",
        "nodes/0/memories/0/similarity_threshold",
        1.5,
        "nodes[0].memories[0].similarity_threshold",
    ),
    ("unknown attachment field", "nodes/0/memories/0/weight", 2, "nodes[0].memories[0].weight"),
    ("bad node id", "nodes/0/id", "has space", "nodes[0].id"),
    ("unknown flow", "nodes/0/flow", "no-such-flow", "nodes[0].flow"),
    ("unknown top-level key", "stores", [], "stores"),
    ("store attached twice", "nodes/0/memories/2/name", "convo_cache", "nodes[0].memories[2].name"),
]


@pytest.mark.parametrize("what,path,value,place", BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_refused_at_its_place_with_nothing_written(
    alice_client, base_doc, what, path, value, place
):
    # A valid state first, so "nothing written" also covers updates.
    assert alice_client.post(URL, base_doc, format="json").status_code == 200
    before = snapshot_db()
    response = alice_client.post(URL, _mutate(base_doc, path, value), format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid_config"
    assert place in error["details"], error
    assert error["message"].startswith(f"{next(iter(error['details']))}: ")
    assert snapshot_db() == before


@pytest.mark.parametrize(
    ("entries", "details"),
    [
        (
            {"memory": [{"name": "a", "type": "simple"}, {"name": "a", "type": "nope"}]},
            {"memory[1].name", "memory[1].type"},
        ),
        (
            {
                "nodes": [
                    {
                        "id": "n",
                        "flow": "{flow}",
                        "memories": [{"name": "zzz", "retrieve_stage": ["lunch"]}],
                    }
                ]
            },
            {"nodes[0].memories[0].name", "nodes[0].memories[0].retrieve_stage[0]"},
        ),
    ],
    ids=["duplicate with an unknown type", "unknown store with a bad stage"],
)
def test_every_problem_of_one_entry_is_named(alice_client, flow, entries, details):
    """A duplicate name stopped the entry's other checks, and an attachment's bad field
    stopped the check of the store it names."""
    for node in entries.get("nodes", []):
        node["flow"] = flow.name
    response = alice_client.post(URL, entries, format="json")
    assert response.status_code == 400, response.json()
    assert set(response.json()["error"]["details"]) == details
    assert not MemoryStore.objects.exists()


def test_every_problem_is_listed_at_once(alice_client, base_doc):
    doc = _mutate(base_doc, "memory/0/type", "vector")
    doc = _mutate(doc, "nodes/0/memories/1/write", True)
    response = alice_client.post(URL, doc, format="json")
    assert sorted(response.json()["error"]["details"]) == [
        "memory[0].type",
        "nodes[0].memories[1].write",
    ]
    assert not MemoryStore.objects.exists()


def test_not_a_mapping_and_bad_yaml(alice_client):
    response = alice_client.post(URL, [1, 2], format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {
        "(document)": ["must be a mapping with memory and nodes"]
    }
    bad_yaml = alice_client.generic("POST", URL, "memory: [", content_type="application/yaml")
    assert bad_yaml.status_code == 400
    assert bad_yaml.json()["error"]["message"].startswith("YAML parse error")
    assert not MemoryStore.objects.exists()


def test_embedding_change_refused_while_the_store_holds_items(alice_client, base_doc, flow):
    assert alice_client.post(URL, base_doc, format="json").status_code == 200
    alice_client.post(
        f"/api/v1/flows/{flow.pk}/nodes/answer/memory/write",
        {"input": "What is the plan?", "output": "The plan is to ship on Friday afternoon."},
        format="json",
    )
    before = snapshot_db()
    doc = _mutate(base_doc, "memory/0/config/embedding", {"provider": "hashing"})
    response = alice_client.post(URL, doc, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {
        "memory[0].config.embedding": [
            "store 'convo_cache' holds 1 items embedded with openai/text-embedding-3-small "
            "(1536 dims); delete its items (or the store) before changing its embedding"
        ]
    }
    doc = _mutate(base_doc, "memory/0/type", "blackboard")
    doc["memory"][0]["config"] = {}
    response = alice_client.post(URL, doc, format="json")
    assert list(response.json()["error"]["details"]) == ["memory[0].type"]
    assert snapshot_db() == before


def test_file_store_embedding_change_reindexes(alice_client, base_doc, alice):
    assert alice_client.post(URL, base_doc, format="json").status_code == 200
    docs = MemoryStore.objects.get(owner=alice, name="project_docs")
    old_kb = docs.knowledge_base_id
    doc = _mutate(base_doc, "memory/1/config/embedding", {"provider": "hashing"})
    body = alice_client.post(URL, doc, format="json").json()
    assert ("store", "update", "project_docs") in [
        (c["kind"], c["action"], c["store"]) for c in body["changes"]
    ]
    assert body["loads"]["project_docs"]["added"] == 3
    docs.refresh_from_db()
    assert docs.knowledge_base_id != old_kb
    assert (docs.embedding_provider, docs.embedding_dimensions) == ("hashing", 384)
    assert docs.knowledge_base.embedding_dimensions == 384


def test_same_config_twice_changes_nothing_and_export_import_is_a_no_op(
    alice_client, base_doc, flow
):
    assert alice_client.post(URL, base_doc, format="json").json()["changed"] is True
    before = snapshot_db()
    again = alice_client.post(URL, base_doc, format="json").json()
    assert again["changed"] is False
    assert {c["action"] for c in again["changes"]} == {"unchanged"}
    assert again["loads"] == {}
    assert snapshot_db() == before

    exported = alice_client.get(URL).json()
    assert [m["name"] for m in exported["memory"]] == ["board", "convo_cache", "project_docs"]
    assert exported["nodes"] == [
        {
            "id": "answer",
            "flow": flow.name,
            "memories": [
                {
                    "name": "convo_cache",
                    "retrieve_stage": ["gen"],
                    "top_k": 5,
                    "similarity_threshold": -1.0,
                    "read": True,
                    "write": True,
                },
                {
                    "name": "project_docs",
                    "retrieve_stage": [],
                    "top_k": 3,
                    "similarity_threshold": -1.0,
                    "read": True,
                    "write": False,
                },
                {
                    "name": "board",
                    "retrieve_stage": ["gen", "critique"],
                    "top_k": 2,
                    "similarity_threshold": -1.0,
                    "read": True,
                    "write": True,
                },
            ],
        }
    ]
    reimport = alice_client.post(URL, exported, format="json").json()
    assert reimport["changed"] is False
    assert snapshot_db() == before


def test_yaml_in_and_out(alice_client, base_doc):
    text = yaml.safe_dump(base_doc)
    response = alice_client.generic("POST", URL, text, content_type="application/yaml")
    assert response.status_code == 200, response.content
    assert response.json()["changed"] is True
    as_yaml = alice_client.get(URL + "?format=yaml")
    assert as_yaml["Content-Type"].startswith("application/yaml")
    assert yaml.safe_load(as_yaml.content) == alice_client.get(URL).json()
    again = alice_client.generic("POST", URL, as_yaml.content, content_type="text/yaml")
    assert again.json()["changed"] is False


def test_dry_run_shows_changes_and_writes_nothing(alice_client, base_doc):
    response = alice_client.post(URL + "?dry_run=true", base_doc, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["dry_run"] is True and body["changed"] is True
    assert [c["action"] for c in body["changes"]] == ["create"] * 6
    assert snapshot_db() == {"stores": [], "items": [], "attachments": []}
    alice_client.post(URL, base_doc, format="json")
    doc = copy.deepcopy(base_doc)
    doc["memory"][2]["config"]["max_items"] = 10
    doc["nodes"][0]["memories"] = doc["nodes"][0]["memories"][:1]
    before = snapshot_db()
    planned = alice_client.post(URL + "?dry_run=true", doc, format="json").json()["changes"]
    assert [(c["kind"], c["action"], c["store"]) for c in planned] == [
        ("store", "unchanged", "convo_cache"),
        ("store", "unchanged", "project_docs"),
        ("store", "update", "board"),
        ("attachment", "unchanged", "convo_cache"),
        ("attachment", "delete", "project_docs"),
        ("attachment", "delete", "board"),
    ]
    assert snapshot_db() == before
    applied = alice_client.post(URL, doc, format="json").json()["changes"]
    assert applied == planned
    assert MemoryStore.objects.get(name="board").config["max_items"] == 10


def test_store_crud_validates_like_the_config(alice_client, alice):
    response = alice_client.post(
        "/api/v1/memory-stores",
        {"name": "notes", "type": "simple", "config": {"max_items": -1, "colour": "red"}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {
        "config.max_items": ["Ensure this value is greater than or equal to 1."],
        "config.colour": ["unknown field"],
    }
    created = alice_client.post(
        "/api/v1/memory-stores", {"name": "notes", "type": "simple"}, format="json"
    )
    assert created.status_code == 201
    body = created.json()
    assert body["embedding"] == {
        "provider": "hashing",
        "model": "hashing-v1",
        "dimensions": 384,
        "source": "default",
    }
    assert body["config"]["max_items"] == 1000
    taken = alice_client.post(
        "/api/v1/memory-stores", {"name": "notes", "type": "blackboard"}, format="json"
    )
    assert taken.status_code == 409
    assert taken.json()["error"]["code"] == "name_taken"
    url = f"/api/v1/memory-stores/{body['id']}"
    patched = alice_client.patch(url, {"config": {"max_items": 7}}, format="json")
    assert patched.json()["config"]["max_items"] == 7
    bad = alice_client.patch(url, {"config": {"max_items": "many"}}, format="json")
    assert bad.status_code == 400
    assert MemoryStore.objects.get(pk=body["id"]).config["max_items"] == 7


def test_store_types_endpoint(alice_client):
    types = {t["name"]: t for t in alice_client.get("/api/v1/memory-store-types").json()["results"]}
    assert set(types) >= {"simple", "file", "blackboard"}
    assert types["file"]["read_only"] is True and types["simple"]["read_only"] is False
    assert types["blackboard"]["embeds"] is False
    fields = {f["name"]: f for f in types["simple"]["config_fields"]}
    assert fields["max_items"] == {
        "name": "max_items",
        "required": False,
        "type": "integer",
        "default": 1000,
        "min_value": 1,
        "max_value": 1_000_000,
        "help": "Oldest items beyond are dropped",
    }
    embedding = {f["name"]: f for f in fields["embedding"]["fields"]}
    assert embedding["provider"]["choices"] == ["openai", "local", "hashing", "none"]
    sources = {f["name"] for f in types["file"]["config_fields"]}
    assert sources == {"index_path", "file_sources", "embedding"}


def test_load_memory_config_command(alice, base_doc, tmp_path: Path, flow):
    path = tmp_path / "memory.yaml"
    path.write_text(yaml.safe_dump(base_doc), encoding="utf-8")
    out = StringIO()
    call_command("load_memory_config", str(path), "--owner", "alice", "--dry-run", stdout=out)
    assert out.getvalue().splitlines()[-1] == "6 would change, 0 unchanged"
    assert not MemoryStore.objects.exists()
    out = StringIO()
    call_command("load_memory_config", str(path), "--owner", "alice", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "create    store convo_cache"
    assert "create    attachment board on support-bot/answer" in lines
    assert lines[-1] == "6 changed, 0 unchanged"
    out = StringIO()
    call_command("load_memory_config", str(path), "--owner", "alice", stdout=out)
    assert out.getvalue().splitlines()[-1] == "0 changed, 6 unchanged"

    bad = copy.deepcopy(base_doc)
    bad["memory"][0]["type"] = "vector"
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    before = snapshot_db()
    with pytest.raises(CommandError) as caught:
        call_command("load_memory_config", str(path), "--owner", "alice")
    assert "memory[0].type: unknown store type 'vector'" in str(caught.value)
    assert snapshot_db() == before
    with pytest.raises(CommandError, match="no user 'carol'"):
        call_command("load_memory_config", str(path), "--owner", "carol")
    assert MemoryItem.objects.count() == 0


def test_a_store_whose_variable_is_unset_is_applied_and_said_not_to_load(
    alice, alice_client, tmp_path: Path, monkeypatch
):
    """A simple store has nothing to load, so its unset ${VAR} went unreported: the
    command said "create store x", "1 changed" and nothing else (audit of the commands,
    finding 17); the API's ``loads`` had no entry for it."""
    monkeypatch.delenv("UNSET_KEY_XYZ", raising=False)
    document = {"memory": [{"name": "notes", "type": "simple", "config": {"embedding": {
        "provider": "openai", "model": "text-embedding-3-small",
        "api_key": "${UNSET_KEY_XYZ}"}}}]}  # fmt: skip
    said = "environment variable UNSET_KEY_XYZ is not set (referenced by a memory store)"
    path = tmp_path / "memory.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    out, err = StringIO(), StringIO()
    call_command("load_memory_config", str(path), "--owner", "alice", stdout=out, stderr=err)
    assert out.getvalue().splitlines() == ["create    store notes", "1 changed, 0 unchanged"]
    assert err.getvalue().splitlines() == [f"not loaded notes: {said}"]
    stored = MemoryStore.objects.get(owner=alice, name="notes").config
    assert stored["embedding"]["api_key"] == "${UNSET_KEY_XYZ}"  # applied all the same
    document["memory"][0]["config"]["embedding"]["model"] = "text-embedding-3-large"
    answer = alice_client.post(URL, document, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["loads"]["notes"]["error"]["message"] == said


def test_a_flow_named_like_another_flows_id_is_exported_by_its_own_id(alice, alice_client, flow):
    """A new user's audit: a flow named with another flow's id was exported by that name,
    which an apply reads as an id first: re-importing the export attached the store to
    the other flow."""
    from memories.conversations.services import flow_create
    from memories.stores.models import MemoryAttachment

    twin = flow_create(owner=alice, name=str(flow.pk))
    doc = {"memory": [{"name": "board", "type": "blackboard", "config": {}}],
           "nodes": [{"id": "n1", "flow": str(twin.pk), "memories": [{"name": "board"}]}]}  # fmt: skip
    assert alice_client.post(URL, doc, format="json").status_code == 200
    exported = alice_client.get(URL).json()
    assert exported["nodes"][0]["flow"] == str(twin.pk)
    again = alice_client.post(URL, exported, format="json").json()
    assert again["changed"] is False, again["changes"]
    assert list(MemoryAttachment.objects.values_list("flow_id", flat=True)) == [twin.pk]
