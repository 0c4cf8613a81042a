from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from knowledge.models import Chunk
from tests.conftest import record

pytestmark = pytest.mark.django_db(transaction=True)


def _call(*args):
    out = StringIO()
    call_command("regenerate_memory", *args, stdout=out)
    return out.getvalue()


def test_dry_run_reports_and_changes_nothing(flow, memory_base):
    record(flow, "s1", "m1", "m2", "m3")
    Chunk.objects.all().delete()
    output = _call(memory_base.name, "--dry-run")
    assert "MISMATCH (chunks missing)" in output
    assert "session s1: processed=3 pending=0" in output
    assert (
        "Dry run: would clear all chunks and re-ingest 3 message(s) in 1 session(s). Nothing changed."
        in output
    )
    assert not Chunk.objects.exists()
    assert memory_base.sessions.get().total_processed == 3


def test_regenerate_by_id_rebuilds_with_progress(flow, memory_base):
    record(flow, "s1", "m1", "m2", "m3")
    record(flow, "s2", "n1")
    Chunk.objects.all().delete()
    output = _call(str(memory_base.pk))
    assert "s1 [##############################] 3/3" in output
    assert "Regenerated: 4 message(s), 4 chunks." in output
    assert Chunk.objects.count() == 4


def test_regenerate_one_session(flow, memory_base):
    record(flow, "s1", "m1", "m2", "m3")
    record(flow, "s2", "n1", "n2", "n3")
    Chunk.objects.filter(session_id="s2").delete()
    output = _call(memory_base.name, "--session", "s2")
    assert "Regenerated: 3 message(s)" in output
    assert Chunk.objects.count() == 6


def test_errors(flow, memory_base):
    with pytest.raises(CommandError, match="No memory base 'nope'"):
        _call("nope")
    with pytest.raises(CommandError, match="no session 'zz'"):
        _call(memory_base.name, "--session", "zz")


def test_an_id_of_another_owners_base_is_no_base_of_the_owner_named(flow, memory_base, bob):
    """``--owner bob`` with alice's memory base id showed (and would have rebuilt)
    alice's base (an operator's audit); ``index_files`` refuses the same case."""
    with pytest.raises(CommandError, match="No memory base"):
        _call(str(memory_base.pk), "--owner", "bob", "--dry-run")
    assert "Dry run" in _call(str(memory_base.pk), "--owner", "alice", "--dry-run")
