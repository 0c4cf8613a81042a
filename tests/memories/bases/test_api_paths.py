"""``/api/v1/memory-bases`` (documented) and ``/api/v1/memories`` (the seed's name) are one
API; Memory Base jobs have the one job shape; during a mismatch the API, the admin and the
command show one chunk count, from the chunk table."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from core.api.serializers import JOB_FIELDS
from knowledge.models import Chunk
from memories.bases import services
from tests.conftest import record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("prefix", ["/api/v1/memory-bases", "/api/v1/memories"])
def test_both_paths_serve_the_same_api(alice_client, bob_client, flow, prefix):
    created = alice_client.post(prefix, {"name": "mem", "flow": str(flow.pk)}, format="json")
    assert created.status_code == 201, created.json()
    mb = created.json()
    for other in ("/api/v1/memory-bases", "/api/v1/memories"):
        assert alice_client.get(f"{other}/{mb['id']}").json() == mb
        assert alice_client.get(other).json()["results"] == [mb]
        assert alice_client.get(f"{other}/{mb['id']}/sessions").json()["results"] == []
        assert bob_client.get(f"{other}/{mb['id']}").status_code == 404
    patched = alice_client.patch(f"{prefix}/{mb['id']}", {"threshold": 7}, format="json")
    assert patched.json()["threshold"] == 7
    assert alice_client.delete(f"{prefix}/{mb['id']}").status_code == 204


def test_memory_base_jobs_have_the_one_job_shape(alice_client, flow, memory_base, monkeypatch):
    monkeypatch.setattr(services, "_dispatch", lambda job: None)
    record(flow, "s1", "m1")
    response = alice_client.post(f"/api/v1/memory-bases/{memory_base.pk}/flush", {}, format="json")
    assert response.status_code == 202
    (job,) = response.json()["jobs"]
    assert list(job)[: len(JOB_FIELDS)] == JOB_FIELDS
    assert (job["kind"], job["status"], job["attempts"], job["session_id"]) == (
        "memory_base_sync",
        "queued",
        0,
        "s1",
    )
    assert job["url"] == f"/api/v1/jobs/{job['id']}"
    assert alice_client.get(job["url"]).json() == job


def test_one_chunk_count_during_a_mismatch(alice_client, admin_client, flow, memory_base):
    record(flow, "s1", "alpha " * 300, "beta", "gamma")  # threshold 3: ingested
    stored = Chunk.objects.filter(knowledge_base=memory_base.knowledge_base).count()
    assert stored > 1

    def shown() -> tuple[int, bool, str, str]:
        api = alice_client.get(f"/api/v1/memory-bases/{memory_base.pk}").json()
        admin = admin_client.get("/admin/memory_bases/memorybase/").content.decode()
        out = StringIO()
        call_command("regenerate_memory", memory_base.name, "--dry-run", stdout=out)
        return api["chunks"], api["mismatch"], admin, out.getvalue()

    chunks, mismatch, admin, command = shown()
    assert (chunks, mismatch) == (stored, False)
    assert f'class="field-chunks">{stored}<' in admin
    assert f"{stored} chunks, consistent" in command

    # Deleted behind the service's back: the stored counters still say `stored`.
    Chunk.objects.filter(knowledge_base=memory_base.knowledge_base).delete()
    memory_base.knowledge_base.refresh_from_db()
    assert memory_base.knowledge_base.chunk_count == stored
    chunks, mismatch, admin, command = shown()
    assert (chunks, mismatch) == (0, True)
    assert 'class="field-chunks">0<' in admin
    assert "0 chunks, MISMATCH (chunks missing)" in command
