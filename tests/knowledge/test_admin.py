import pytest

from knowledge.models import Chunk
from tests.knowledge.factories import ingest, make_kb

pytestmark = pytest.mark.django_db


def test_admin_lists_bases_with_counts_and_memory_flag(admin_client, alice):
    kb = make_kb(alice, name="notes")
    make_kb(alice, name="memory", is_memory_base=True)
    ingest(kb, ("a", "hello world"), ("b", "second doc"))
    html = admin_client.get("/admin/knowledge/knowledgebase/").content.decode()
    assert "notes" in html and "memory" in html
    assert 'class="field-chunks">2<' in html


def test_chunk_browser_searches_text_and_never_renders_vectors(admin_client, alice):
    kb = make_kb(alice)
    ingest(
        kb,
        ("a", "the running foxes", {"session_id": "s1"}),
        ("b", "sleeping cats", {"session_id": "s2"}),
    )
    listing = admin_client.get("/admin/knowledge/chunk/?q=fox").content.decode()
    assert "the running foxes" in listing and "sleeping cats" not in listing
    by_session = admin_client.get("/admin/knowledge/chunk/?q=s2").content.decode()
    assert "sleeping cats" in by_session and "the running foxes" not in by_session
    chunk = Chunk.objects.get(source_key="a#0")
    detail = admin_client.get(f"/admin/knowledge/chunk/{chunk.pk}/change/").content.decode()
    assert "the running foxes" in detail
    assert "embedding" not in detail.lower()


def test_chunk_browser_filters_pending_rows(admin_client, alice):
    from knowledge.services import knowledge_index_pending

    kb = make_kb(alice)
    ingest(kb, ("a", "indexed already"))
    knowledge_index_pending()
    ingest(kb, ("b", "still waiting"))
    pending = admin_client.get("/admin/knowledge/chunk/?index_pending__exact=1").content.decode()
    assert "still waiting" in pending and "indexed already" not in pending


def test_ingest_jobs_are_listed_without_their_payload(admin_client, alice):
    from knowledge.services import DocumentIn, knowledge_ingest_job_create

    kb = make_kb(alice, name="notes")
    job = knowledge_ingest_job_create(
        knowledge_base=kb, documents=[DocumentIn(text="secret payload text", source_key="k")]
    )
    listing = admin_client.get("/admin/knowledge/ingestjob/").content.decode()
    assert str(job.pk) in listing and "queued" in listing
    detail = admin_client.get(f"/admin/knowledge/ingestjob/{job.pk}/change/").content.decode()
    assert "notes" in detail and "secret payload text" not in detail


def test_a_confirmation_page_names_each_objects_owner(admin_client, alice, bob):
    """Two owners' bases of one name were listed alike on the page asking to delete them."""
    from knowledge.models import KnowledgeBase

    ids = [make_kb(alice, name="notes").pk, make_kb(bob, name="notes").pk]
    page = admin_client.post("/admin/knowledge/knowledgebase/",
                             {"action": "delete_with_chunks", "_selected_action": ids})  # fmt: skip
    html = page.content.decode()
    assert page.status_code == 200 and "Delete these knowledge bases?" in html
    assert '<strong>notes</strong> <span class="confirm-owner">(owner: alice)</span>' in html
    assert '<strong>notes</strong> <span class="confirm-owner">(owner: bob)</span>' in html
    assert KnowledgeBase.objects.filter(pk__in=ids).count() == 2  # asked, nothing deleted
