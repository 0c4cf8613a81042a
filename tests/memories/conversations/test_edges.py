"""Input at the edges of the conversation and memory-base API (a new user's audit,
2026-11-28): each is a 4xx naming what is wrong, with nothing written, never a 500, and
never a value silently turned into another."""

from __future__ import annotations

import pytest

from memories.bases.models import MemoryBase, MemoryBaseJob
from memories.bases.services import memory_base_create
from memories.conversations.models import Message

pytestmark = pytest.mark.django_db


def _post(client, flow, **fields):
    body = {"flow": str(flow.pk), "session_id": "s1", "role": "user", "content": "hi", **fields}
    return client.post("/api/v1/messages", body, format="json")


@pytest.mark.parametrize("digits", ["²", "١", "99999999999999999999999", "0"])
def test_a_message_id_of_other_digits_names_no_server_id(alice_client, flow, digits):
    first = _post(alice_client, flow)
    assert first.status_code == 201, first.content
    history = alice_client.get("/api/v1/conversations/s1/history",
                               {"flow": str(flow.pk), "current_message_id": digits})  # fmt: skip
    assert history.status_code == 422, history.content
    assert history.json()["error"]["code"] == "unknown_message"
    followed = _post(alice_client, flow, parent_message_id=digits)
    assert followed.status_code == 422, followed.content
    assert Message.objects.count() == 1


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"session_id": 12345}, "session_id"),
        ({"message_id": 777}, "message_id"),
        ({"content": [{"type": "text", "text": None}, {"type": "text", "text": "x"}]}, "content"),
        ({"content": [{"type": "text", "text": {"a": 1}}]}, "content"),
    ],
)
def test_a_number_or_an_object_is_no_text(alice_client, flow, fields, field):
    answer = _post(alice_client, flow, **fields)
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["error"]["details"], answer.json()
    assert not Message.objects.exists()


def test_a_long_name_makes_its_knowledge_base_name_fit(alice, alice_client, flow):
    name = "x" * 200
    made = alice_client.post("/api/v1/memory-bases", {"name": name, "flow": str(flow.pk)},
                             format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    base = MemoryBase.objects.get()
    assert base.knowledge_base.name == ("Memory: " + name)[:200] == base.kb_name


def test_an_unknown_field_is_a_400_not_the_widest_request(alice, alice_client, flow):
    base = memory_base_create(owner=alice, name="mb", flow=flow)
    for action in ("flush", "regenerate"):
        answer = alice_client.post(f"/api/v1/memory-bases/{base.pk}/{action}",
                                   {"session": "order-77"}, format="json")  # fmt: skip
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"]["details"] == {"session": ["Unknown field session."]}
    made = alice_client.post("/api/v1/memory-bases", {"name": "other", "flow": str(flow.pk),
                                                      "bogus": 1}, format="json")  # fmt: skip
    assert made.status_code == 400 and "bogus" in made.json()["error"]["details"]
    assert not MemoryBaseJob.objects.exists() and MemoryBase.objects.count() == 1


def test_its_own_ids_sent_back_in_upper_case_are_no_change(alice, alice_client, flow):
    base = memory_base_create(owner=alice, name="mb", flow=flow)
    body = {"flow": str(flow.pk).upper(), "knowledge_base": str(base.knowledge_base_id).upper(),
            "threshold": 5}  # fmt: skip
    answer = alice_client.patch(f"/api/v1/memory-bases/{base.pk}", body, format="json")
    assert answer.status_code == 200, answer.content
    base.refresh_from_db()
    assert base.threshold == 5


def test_a_history_answer_is_what_its_schema_says(alice_client, flow, settings):
    """The default answer (format=messages) has no ``text``, and strategy=summarize adds
    ``strategy`` and ``summary``: the schema said ``text`` was always there and knew
    neither of the others (checked against the served schema with jsonschema)."""
    import jsonschema
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    answer = schema["paths"]["/api/v1/conversations/{session_id}/history"]["get"]
    ref = answer["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    validator = jsonschema.Draft202012Validator(
        {"$ref": ref, "components": schema["components"]}, format_checker=None
    )
    assert _post(alice_client, flow, content="Hello there").status_code == 201
    for params in ({}, {"format": "text"}, {"strategy": "summarize"}):
        got = alice_client.get("/api/v1/conversations/s1/history",
                               {"flow": str(flow.pk), **params})  # fmt: skip
        assert got.status_code == 200, got.content
        validator.validate(got.json())
    assert "text" not in alice_client.get("/api/v1/conversations/s1/history",
                                          {"flow": str(flow.pk)}).json()  # fmt: skip


def test_a_summary_budget_error_names_its_field(alice_client, flow):
    url = "/api/v1/conversations/s1/history"
    cases = [
        ({"strategy": "summarize", "max_tokens": 20}, "max_summary_tokens",
         "must be less than max_tokens (20), not 256 (256 unless given)"),
        ({"strategy": "summarize", "max_tokens": 300, "max_tokens_before_summary": 16,
          "max_summary_tokens": 50}, "max_tokens_before_summary",
         "must be a whole number of at least 300, not 16"),
    ]  # fmt: skip
    for params, field, said in cases:
        answer = alice_client.get(url, {"flow": str(flow.pk), **params})
        assert answer.status_code == 400, answer.content
        error = answer.json()["error"]
        assert (error["message"], error["details"]) == (f"{field}: {said}", {field: [said]})


def test_a_message_without_a_message_id_is_listed_by_its_server_id(alice_client, flow):
    """Listings answered ``message_id: null`` where the docs (and the history) say
    "yours, else the server id"."""
    mine = _post(alice_client, flow, message_id="q1").json()
    bare = _post(alice_client, flow).json()
    assert (mine["message_id"], bare["message_id"]) == ("q1", bare["id"])
    listed = alice_client.get("/api/v1/messages", {"flow": str(flow.pk), "session_id": "s1"})
    assert [(m["id"], m["message_id"]) for m in listed.json()["results"]] == [
        (mine["id"], "q1"), (bare["id"], bare["id"]),
    ]  # fmt: skip
