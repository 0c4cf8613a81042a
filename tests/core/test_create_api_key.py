"""`manage.py create_api_key NAME --create-user` on a fresh install."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from core.models import APIKey

pytestmark = pytest.mark.django_db


def test_unknown_user_says_how_to_create_one_and_writes_nothing():
    with pytest.raises(CommandError) as error:
        call_command("create_api_key", "alice")
    assert str(error.value) == (
        "No user named 'alice'. Add --create-user to create it, or create one with "
        "`manage.py createsuperuser` (or in the admin: Users → Add)."
    )
    assert not get_user_model().objects.exists() and not APIKey.objects.exists()


def test_create_user_makes_an_api_only_user_and_its_key(capsys):
    call_command("create_api_key", "alice", "--create-user", "--name", "laptop")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "Created user alice (API access only, no password)."
    user = get_user_model().objects.get(username="alice")
    assert not user.has_usable_password() and not user.is_staff
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {lines[-1]}")
    assert client.get("/api/v1/me").json()["username"] == "alice"
    # Again: the user exists, only a second key is made.
    call_command("create_api_key", "alice", "--create-user")
    assert "Created user" not in capsys.readouterr().out
    assert get_user_model().objects.count() == 1 and APIKey.objects.count() == 2
