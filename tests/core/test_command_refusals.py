"""The operator's commands refuse bad input with one line and change nothing (an
operator's audit found tracebacks, a base left behind, a setting taken that loops)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from core.models import APIKey
from knowledge.models import KnowledgeBase

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["alice", "--expires-at", "2030-02-30T00:00:00Z"], "--expires-at '2030-02-30T00:00:00Z' is no time"),
        (["alice", "--expires-at", "2030-01-01T00:00:00+25:00"], "is no time"),
        (["alice", "--name", "x" * 101], "--name is at most 100 characters"),
        (["", "--create-user"], "'' is no username: Enter a valid username"),
        (["bad user/name", "--create-user"], "'bad user/name' is no username: Enter a valid username"),
        (["u" * 151, "--create-user"], "is no username: 1 to 150 characters"),
    ],
)  # fmt: skip
def test_create_api_key_refuses_in_one_line_and_makes_nothing(alice, args, said):
    users, keys = User.objects.count(), APIKey.objects.count()
    with pytest.raises(CommandError, match=said.replace("(", r"\(").replace("+", r"\+")):
        call_command("create_api_key", *args, stdout=StringIO())
    assert (User.objects.count(), APIKey.objects.count()) == (users, keys)


def test_index_files_refuses_an_unknown_encoding_before_making_the_base(alice, tmp_path):
    (tmp_path / "a.md").write_text("hello")
    with pytest.raises(CommandError, match="unknown encoding 'nosuchenc'"):
        call_command("index_files", "NewBase", str(tmp_path), "--owner", "alice", "--create",
                     "--encoding", "nosuchenc", stdout=StringIO())  # fmt: skip
    assert not KnowledgeBase.objects.filter(name="NewBase").exists()


@pytest.mark.parametrize("value", ["-5", "0", "0.5"])
def test_worker_refuses_a_stall_limit_under_a_second(value):
    with pytest.raises(CommandError, match="--stall-seconds must be at least 1"):
        call_command("worker", "--stall-seconds", value)


def test_serve_refuses_no_web_workers():
    with pytest.raises(CommandError, match="--web-workers: must be at least 1, got 0"):
        call_command("serve", "--web-workers", "0")


def test_serve_refuses_an_address_it_cannot_listen_on():
    """A port in use, port 99999, a host that resolves to nothing: gunicorn exited at
    once and the supervisor restarted it forever. Checked before anything is prepared."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot listen on 127.0.0.1:{port}: "):
            call_command("serve", "--host", "127.0.0.1", "--port", str(port))
    with pytest.raises(CommandError, match="cannot listen on 127.0.0.1:99999: "):
        call_command("serve", "--host", "127.0.0.1", "--port", "99999")
    with pytest.raises(CommandError, match="cannot listen on no-such-host.invalid:8000: "):
        call_command("serve", "--host", "no-such-host.invalid", "--port", "8000")
