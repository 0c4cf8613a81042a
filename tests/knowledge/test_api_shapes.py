"""One job shape (knowledge-base batches and /api/v1/jobs/{id} agree) and PATCH refusing
the fields a knowledge base's chunks were made with."""

from __future__ import annotations

import pytest

from core.api.serializers import JOB_FIELDS
from knowledge.models import KnowledgeBase
from tests.knowledge.factories import make_kb

pytestmark = pytest.mark.django_db


def test_a_knowledge_base_job_has_the_one_job_shape_everywhere(
    alice, alice_client, bob_client, django_capture_on_commit_callbacks
):
    kb = make_kb(alice)
    with django_capture_on_commit_callbacks(execute=False):
        accepted = alice_client.post(
            f"/api/v1/knowledge-bases/{kb.pk}/documents",
            {"documents": [{"text": "hello world", "source_key": "d"}], "background": True},
            format="json",
        )
    assert accepted.status_code == 202
    body = accepted.json()
    job_id = body["id"]
    assert list(body)[: len(JOB_FIELDS)] == JOB_FIELDS
    assert (body["kind"], body["status"], body["attempts"], body["documents"]) == (
        "knowledge_ingest",
        "queued",
        0,
        1,
    )
    assert body["url"] == f"/api/v1/jobs/{job_id}"
    assert "job" not in body  # (no copy of itself under "job" any more: one shape)
    by_base = alice_client.get(accepted["Location"]).json()
    generic = alice_client.get(body["url"])
    assert generic.status_code == 200
    assert generic.json() == by_base == body
    assert bob_client.get(body["url"]).status_code == 404


@pytest.mark.parametrize(
    "field, value",
    [
        ("chunk_size", 500),
        ("chunk_overlap", 10),
        ("language", "french"),
        ("source_kind", "files"),
        ("is_memory_base", True),
    ],
)
def test_patch_refuses_immutable_fields_and_changes_nothing(alice, alice_client, field, value):
    kb = make_kb(alice)
    before = KnowledgeBase.objects.filter(pk=kb.pk).values().get()
    response = alice_client.patch(
        f"/api/v1/knowledge-bases/{kb.pk}", {"name": "renamed", field: value}, format="json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == (
        f"{field}: {field} cannot be changed after the knowledge base is created (its chunks "
        "were made with it): create a new knowledge base and ingest again."
    )
    assert list(error["details"]) == [field]
    assert KnowledgeBase.objects.filter(pk=kb.pk).values().get() == before


def test_patch_accepts_a_get_body_sent_back_and_refuses_unknown_fields(alice, alice_client):
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}"
    body = {**alice_client.get(url).json(), "description": "new"}
    response = alice_client.patch(url, body, format="json")
    assert response.status_code == 200 and response.json()["description"] == "new"
    unknown = alice_client.patch(url, {"colour": "blue"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["message"] == (
        "colour: Unknown field colour: only name and description can be changed."
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("chunk_size", "1000", "Must be a whole number."),
        ("chunk_size", 1000.0, "Must be a whole number."),
        ("chunk_overlap", True, "Must be a whole number."),
        ("is_memory_base", 0, "Must be a boolean (true or false)."),
        ("language", 7, "Must be a string."),
    ],
)
def test_patch_refuses_an_unchanged_fixed_field_of_another_type(
    alice, alice_client, field, value, message
):
    """``"chunk_size": "1000"`` for a base of 1000 passed as "unchanged", and ``1000.0``
    was refused as "cannot be changed": a fixed field's value of another JSON type is
    its type error, as every field's, and nothing changes."""
    kb = make_kb(alice)
    assert (kb.chunk_size, kb.chunk_overlap, kb.is_memory_base) == (1000, 100, False)
    before = KnowledgeBase.objects.filter(pk=kb.pk).values().get()
    response = alice_client.patch(
        f"/api/v1/knowledge-bases/{kb.pk}", {"name": "renamed", field: value}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == f"{field}: {message}"
    assert KnowledgeBase.objects.filter(pk=kb.pk).values().get() == before


def test_patch_as_a_form_compares_fixed_fields_as_text(alice, alice_client):
    kb = make_kb(alice)
    url = f"/api/v1/knowledge-bases/{kb.pk}"
    same = alice_client.patch(url, "name=renamed&chunk_size=1000",
                              content_type="application/x-www-form-urlencoded")  # fmt: skip
    assert same.status_code == 200 and same.json()["name"] == "renamed"
    other = alice_client.patch(url, "chunk_size=500",
                               content_type="application/x-www-form-urlencoded")  # fmt: skip
    assert other.status_code == 400
    assert KnowledgeBase.objects.get(pk=kb.pk).chunk_size == 1000
