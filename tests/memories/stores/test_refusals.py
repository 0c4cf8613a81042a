"""What the stores' doors refuse, and how: a store's name and type are not changed by a
PATCH that also changes its config; an export in a format the door does not write is a
400 naming ``format``; a node write's errors name the same path in ``message`` and
``details``; a YAML NaN is named as such. Each refusal changes nothing."""

from __future__ import annotations

import pytest

from memories.stores.models import MemoryItem, MemoryStore
from tests.memories.stores.conftest import snapshot_db

pytestmark = pytest.mark.django_db
URL = "/api/v1/memory-stores"


@pytest.fixture
def board(alice_client, flow):
    document = {
        "memory": [{"name": "board", "type": "blackboard", "config": {"max_items": 5}}],
        "nodes": [{"id": "answer", "flow": flow.name, "memories": [{"name": "board"}]}],
    }
    assert alice_client.post("/api/v1/memory-config", document, format="json").status_code == 200
    return MemoryStore.objects.get(name="board")


@pytest.mark.parametrize(
    ("change", "details"),
    [
        ({"name": "renamed"}, {"name": ["name cannot be changed: create a store under the new "
                                        "name and attach it in the node's place "
                                        "(docs/memory-stores.md)."]}),
        ({"type": "simple"}, {"type": ["type cannot be changed: create a store under the new "
                                       "type and attach it in the node's place "
                                       "(docs/memory-stores.md)."]}),
        ({"bogus": 1}, {"bogus": ["Unknown field bogus."]}),
    ],
)  # fmt: skip
def test_a_patch_naming_another_name_or_type_is_refused_and_changes_nothing(
    alice_client, board, change, details
):
    before = snapshot_db()
    response = alice_client.patch(f"{URL}/{board.pk}", {"config": {"max_items": 3}, **change},
                                  format="json")  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["details"] == details
    assert snapshot_db() == before


@pytest.mark.parametrize("change", [{"name": "renamed"}, {"type": "simple"}])
def test_a_patch_of_only_a_name_or_type_names_it_not_the_missing_config(
    alice_client, board, change
):
    before = snapshot_db()
    response = alice_client.patch(f"{URL}/{board.pk}", change, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    (key,) = change
    assert list(error["details"]) == [key]
    assert error["message"].startswith(f"{key}: {key} cannot be changed: ")
    assert snapshot_db() == before


def test_a_get_body_sent_back_with_a_new_config_is_applied(alice_client, board):
    body = alice_client.get(f"{URL}/{board.pk}").json()
    body["config"] = {**body["config"], "max_items": 3}
    response = alice_client.patch(f"{URL}/{board.pk}", body, format="json")
    assert response.status_code == 200, response.json()
    board.refresh_from_db()
    assert (board.name, board.type, board.config["max_items"]) == ("board", "blackboard", 3)


@pytest.mark.parametrize("path", ["/api/v1/memory-config", URL])
def test_a_format_the_door_does_not_write_is_a_400_naming_format(alice_client, board, path):
    response = alice_client.get(path, {"format": "xml"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["message"].startswith("format: this path answers in json")
    assert list(error["details"]) == ["format"]
    assert alice_client.get("/api/v1/memory-config", {"format": "yaml"}).status_code == 200


@pytest.mark.parametrize(
    ("body", "path", "said"),
    [
        ({"input": "x", "output": {"text": 5}}, "output.text", "must be a string"),
        ({"input": "x", "output": {"text": "ok", "blocks": [{"type": "weird"}]}},
         "output.blocks[0]", "a block is an object with type text, image, file"),
        ({"input": "x", "output": {"blocks": [{"type": "text", "text": 3}]}},
         "output.blocks[0].text", "must be a string"),
        ({"input": "x", "output": {"blocks": "no"}}, "output.blocks", "must be a list"),
        ({"input": 123, "output": "ok"}, "input", "a string or an object with text and blocks"),
        ({"input": "x", "output": {"blocks": [{"type": "image"}]}},
         "output.blocks[0]", "an image block needs url (a reference) or data (base64)"),
        ({"input": "x", "output": {"blocks": [{"type": "file", "data": "%%"}]}},
         "output.blocks[0].data", "not valid base64"),
    ],
)  # fmt: skip
def test_a_node_writes_error_names_one_path_in_message_and_details(
    alice_client, flow, board, body, path, said
):
    response = alice_client.post(f"/api/v1/flows/{flow.pk}/nodes/answer/memory/write", body,
                                 format="json")  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["message"], error["details"]) == (f"{path}: {said}", {path: [said]})
    assert not MemoryItem.objects.exists()


@pytest.mark.parametrize(
    ("value", "said"), [(".nan", "NaN is no number"), (".inf", "1e999 and .inf are out of range")]
)
def test_a_yaml_nan_or_infinity_is_named_as_such(alice_client, value, said):
    document = f"memory:\n  - name: board\n    type: blackboard\n    config: {{x: {value}}}\n"
    response = alice_client.generic(
        "POST", "/api/v1/memory-config", document, content_type="application/yaml"
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {
        "memory[0].config.x": [f"Numbers must be finite ({said})."]
    }
    assert not MemoryStore.objects.exists()


def test_a_yaml_number_in_exponent_form_is_a_number(alice_client, flow):
    """PyYAML (YAML 1.1) reads ``5e-1`` as text, which a number field now refuses: the
    configuration's YAML reads it as JSON and YAML 1.2 do."""
    document = (
        "memory:\n  - name: board\n    type: blackboard\n"
        f"nodes:\n  - id: answer\n    flow: {flow.name}\n"
        "    memories:\n      - {name: board, similarity_threshold: 5e-1, top_k: 3}\n"
    )
    response = alice_client.generic(
        "POST", "/api/v1/memory-config", document, content_type="application/yaml"
    )
    assert response.status_code == 200, response.json()
    exported = alice_client.get("/api/v1/memory-config").json()
    assert exported["nodes"][0]["memories"][0]["similarity_threshold"] == 0.5


def alias_bomb(levels: int) -> str:
    """A few hundred bytes of YAML whose aliases expand tenfold per level."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    board = (
        f"memory:\n  - {{name: board, type: blackboard, config: {{memory_path: *a{levels - 1}}}}}"
    )
    return "\n".join([*lines, board]) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(alice_client):
    """Seven levels (428 bytes, ten million values) held a worker for 37 s; the aliases
    are now counted on the parsed nodes, so even four levels (23,441 values) are refused."""
    response = alice_client.generic(
        "POST", "/api/v1/memory-config?dry_run=true", alias_bomb(4), content_type="application/yaml"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "parse_error"
    assert (
        "YAML aliases may repeat at most 20,000 values in all; these repeat 23,441."
        in (error["message"])
    )
    assert not MemoryStore.objects.exists()


def test_a_yaml_alias_to_its_own_node_is_refused(alice_client):
    document = "memory: &m\n  - {name: board, type: blackboard, config: {x: *m}}\n"
    response = alice_client.generic(
        "POST", "/api/v1/memory-config", document, content_type="application/yaml"
    )
    assert response.status_code == 400
    assert "may not refer to a node that contains it" in response.json()["error"]["message"]
    assert not MemoryStore.objects.exists()


def test_a_yaml_alias_that_repeats_a_few_values_still_works(alice_client, flow):
    document = (
        "memory:\n  - {name: board, type: blackboard}\n  - {name: notes, type: blackboard}\n"
        f"nodes:\n  - id: answer\n    flow: {flow.name}\n    memories:\n"
        "      - &usual {name: board, similarity_threshold: 0.5, top_k: 3}\n"
        "      - {<<: *usual, name: notes}\n"
    )
    response = alice_client.generic(
        "POST", "/api/v1/memory-config", document, content_type="application/yaml"
    )
    assert response.status_code == 200, response.json()
    memories = alice_client.get("/api/v1/memory-config").json()["nodes"][0]["memories"]
    assert [(m["name"], m["similarity_threshold"], m["top_k"]) for m in memories] == [
        ("board", 0.5, 3),
        ("notes", 0.5, 3),
    ]


def test_a_large_config_sharing_an_anchor_is_read():
    """An embedding block of 11 values named by 200 stores repeats 2,200: refused when
    the limit was 1,000, though no bomb."""
    from memories.stores.api.parsers import yaml_load

    text = "usual: &usual {provider: openai, model: m, params: {dimensions: 8, a: 1}}\nmemory:\n"
    text += "".join(f"  - {{name: s{i}, type: simple, config: {{embedding: *usual}}}}\n"
                    for i in range(200))  # fmt: skip
    loaded = yaml_load(text)
    assert len(loaded["memory"]) == 200
    assert loaded["memory"][199]["config"]["embedding"]["params"] == {"dimensions": 8, "a": 1}
