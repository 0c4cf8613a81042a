"""``content`` is accepted everywhere for personal memories; ``text`` stays an alias."""

from __future__ import annotations

import pytest

from memories.facts.models import Fact

pytestmark = pytest.mark.django_db
BASE = "/api/v1/users/u1/memories"


@pytest.fixture(autouse=True)
def _embedder(fixture_embedder):
    return fixture_embedder


@pytest.mark.parametrize("field", ["content", "text"])
def test_post_takes_content_or_its_alias_text(alice_client, field):
    response = alice_client.post(
        BASE, {field: "User plays the violin", "infer": False}, format="json"
    )
    assert response.status_code == 201, response.json()
    (memory,) = response.json()["memories"]
    assert memory["content"] == "User plays the violin"
    # The same field name edits it, and global memories take it too.
    patched = alice_client.patch(f"{BASE}/{memory['id']}", {"content": "User prefers dark mode"})
    assert patched.status_code == 200 and patched.json()["content"] == "User prefers dark mode"
    fact = "The support team is available on weekdays from 9 to 5"
    glob = alice_client.post("/api/v1/global-memories", {"content": fact})
    assert glob.status_code == 201 and glob.json()["content"] == fact


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"content": "a", "text": "b"},
            "content: Give content or text (the same field), not both.",
        ),
        ({"content": "   "}, "content: This field may not be blank."),
        ({}, "content: Give either a non-empty content or messages."),
        (
            {"content": "a", "messages": [{"role": "user", "content": "b"}]},
            "content: Give either a non-empty content or messages.",
        ),
    ],
)
def test_bad_content_is_a_plain_400_and_stores_nothing(alice_client, body, message):
    response = alice_client.post(BASE, {**body, "infer": False}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message
    assert not Fact.objects.exists()


def test_content_and_text_may_agree(alice_client):
    body = {
        "content": "User drinks green tea every morning",
        "text": "User drinks green tea every morning",
        "infer": False,
    }
    assert alice_client.post(BASE, body, format="json").status_code == 201
    assert list(Fact.objects.values_list("content", flat=True)) == [
        "User drinks green tea every morning"
    ]
