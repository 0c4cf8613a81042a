"""Authentication and tenancy: owner, other tenant, anonymous, revoked key."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from core.models import APIKey
from core.services import api_key_create, api_key_digest, api_key_revoke

pytestmark = pytest.mark.django_db


def test_bearer_key_authenticates_its_owner(alice_client):
    response = alice_client.get("/api/v1/me")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"


def test_keys_are_stored_hashed(alice):
    api_key, raw_key = api_key_create(owner=alice, name="ci")
    stored = APIKey.objects.get(pk=api_key.pk)
    assert stored.digest == api_key_digest(raw_key)
    assert raw_key not in {stored.digest, stored.prefix, stored.name}
    assert raw_key.startswith(stored.prefix)


def test_anonymous_gets_401_json(anon_client):
    response = anon_client.get("/api/v1/me")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_unknown_key_gets_401(anon_client):
    anon_client.credentials(HTTP_AUTHORIZATION="Bearer mem_not-a-key")
    response = anon_client.get("/api/v1/me")
    assert response.status_code == 401
    assert response.json() == {
        "error": {
            "code": "not_authenticated",
            "message": "Invalid, expired or revoked API key.",
            "details": None,
        }
    }


def test_malformed_authorization_header_gets_401(anon_client):
    anon_client.credentials(HTTP_AUTHORIZATION="Bearer two parts")
    assert anon_client.get("/api/v1/me").status_code == 401


def test_revoked_key_is_refused(alice):
    api_key, raw_key = api_key_create(owner=alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    assert client.get("/api/v1/me").status_code == 200
    api_key_revoke(api_key=api_key)
    assert client.get("/api/v1/me").status_code == 401


def test_revoking_twice_keeps_first_time(alice):
    api_key, _ = api_key_create(owner=alice)
    first = api_key_revoke(api_key=api_key).revoked_at
    assert api_key_revoke(api_key=api_key).revoked_at == first


def test_inactive_owner_key_is_refused(alice):
    _, raw_key = api_key_create(owner=alice)
    alice.is_active = False
    alice.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    assert client.get("/api/v1/me").status_code == 401


def test_session_auth_works_for_browsable_api(alice):
    client = APIClient()
    client.force_login(alice)
    assert client.get("/api/v1/me").json()["username"] == "alice"


def test_key_list_shows_only_own_keys(alice, alice_client, bob):
    api_key_create(owner=bob, name="bobs")
    response = alice_client.get("/api/v1/api-keys")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    assert [k["name"] for k in body["results"]] == ["test"]
    assert "digest" not in body["results"][0]


def test_create_key_through_api_returns_it_once(alice_client):
    response = alice_client.post("/api/v1/api-keys", {"name": "deploy"}, format="json")
    assert response.status_code == 201
    raw_key = response.json()["key"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    assert client.get("/api/v1/me").json()["username"] == "alice"
    listed = alice_client.get("/api/v1/api-keys").json()["results"]
    assert all("key" not in item for item in listed)


def test_other_tenants_key_is_404_and_unchanged(alice_client, bob):
    bobs_key, _ = api_key_create(owner=bob, name="bobs")
    assert alice_client.get(f"/api/v1/api-keys/{bobs_key.pk}").status_code == 404
    response = alice_client.delete(f"/api/v1/api-keys/{bobs_key.pk}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    bobs_key.refresh_from_db()
    assert bobs_key.revoked_at is None


def test_owner_revokes_own_key_through_api(alice, alice_client):
    other, raw_key = api_key_create(owner=alice, name="old")
    response = alice_client.delete(f"/api/v1/api-keys/{other.pk}")
    assert response.status_code == 200
    assert response.json()["is_active"] is False
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    assert client.get("/api/v1/me").status_code == 401


def test_anonymous_cannot_list_or_revoke(anon_client, alice):
    api_key, _ = api_key_create(owner=alice)
    assert anon_client.get("/api/v1/api-keys").status_code == 401
    assert anon_client.delete(f"/api/v1/api-keys/{api_key.pk}").status_code == 401
    api_key.refresh_from_db()
    assert api_key.revoked_at is None


def test_create_api_key_command_prints_key_on_last_line(alice, capsys):
    call_command("create_api_key", "alice", "--name", "cli")
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith("mem_")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {last_line}")
    assert client.get("/api/v1/me").json()["username"] == "alice"
    assert APIKey.objects.get(owner=alice, name="cli").digest == api_key_digest(last_line)


def test_create_api_key_command_unknown_user(db):
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        call_command("create_api_key", "nobody")
    assert APIKey.objects.count() == 0


def test_admin_creates_key_and_shows_it_once(admin_client, alice):
    response = admin_client.post(
        "/admin/core/apikey/add/", {"owner": alice.pk, "name": "from-admin"}, follow=True
    )
    assert response.status_code == 200
    api_key = APIKey.objects.get(name="from-admin")
    shown = [str(m) for m in response.context["messages"]]
    raw_key = next(m.split(": ", 1)[1] for m in shown if "shown once" in m)
    assert api_key_digest(raw_key) == api_key.digest
    assert api_key.owner == alice


def test_admin_shows_llm_notice_only_when_unconfigured(admin_client, settings):
    settings.LLM_BASE_URL = ""
    assert b"No chat LLM is configured" in admin_client.get("/admin/").content
    settings.LLM_BASE_URL = "http://127.0.0.1:1/v1"
    settings.LLM_MODEL = "m"
    assert b"No chat LLM is configured" not in admin_client.get("/admin/").content
