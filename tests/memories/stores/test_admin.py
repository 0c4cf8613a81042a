import pytest

from core.validation import NODE_ID
from memories.stores.config import memory_config_apply
from memories.stores.models import MemoryAttachment, MemoryItem, MemoryStore
from memories.stores.runtime import node_memory_write

pytestmark = pytest.mark.django_db
NODE_ID_MESSAGE = NODE_ID.message


@pytest.fixture
def stores(alice, flow):
    memory_config_apply(
        owner=alice,
        document={
            "memory": [
                {"name": "notes", "type": "simple", "config": {}},
                {"name": "log", "type": "blackboard", "config": {}},
            ],
            "nodes": [
                {"id": "n1", "flow": flow.name, "memories": [{"name": "notes"}, {"name": "log"}]}
            ],
        },
    )
    for n in range(3):
        node_memory_write(
            flow=flow, node_id="n1", input=f"question {n}", output=f"A long enough answer {n}."
        )
    return {s.name: s for s in MemoryStore.objects.all()}


def test_admin_lists_stores_with_item_counts_and_browses_items(admin_client, stores):
    html = admin_client.get("/admin/memory_stores/memorystore/").content.decode()
    assert 'class="field-item_count">3<' in html and "notes" in html and "log" in html
    detail = admin_client.get(
        f"/admin/memory_stores/memorystore/{stores['notes'].pk}/change/"
    ).content.decode()
    assert "n1" in detail  # the attachment inline
    items = admin_client.get(
        f"/admin/memory_stores/memoryitem/?store__id__exact={stores['notes'].pk}"
    ).content.decode()
    assert "Input: question 2 Output: A long enough answer 2." in items
    item = MemoryItem.objects.filter(store=stores["notes"]).first()
    page = admin_client.get(f"/admin/memory_stores/memoryitem/{item.pk}/change/").content.decode()
    assert "A long enough answer" in page and "embedding" not in page.lower()


def test_admin_deletes_an_item_and_a_store_with_its_items(admin_client, stores):
    item = MemoryItem.objects.filter(store=stores["notes"]).first()
    response = admin_client.post(
        f"/admin/memory_stores/memoryitem/{item.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302
    assert not MemoryItem.objects.filter(pk=item.pk).exists()
    chosen = {"action": "delete_with_items", "_selected_action": [str(stores["notes"].pk)]}
    asked = admin_client.post("/admin/memory_stores/memorystore/", chosen)
    assert asked.status_code == 200 and "Delete these memory stores?" in asked.content.decode()
    assert MemoryStore.objects.filter(name="notes").exists()  # only asked
    response = admin_client.post(
        "/admin/memory_stores/memorystore/", {**chosen, "confirmed": "yes"}
    )
    assert response.status_code == 302
    assert not MemoryStore.objects.filter(name="notes").exists()
    assert not MemoryItem.objects.filter(store_id=stores["notes"].pk).exists()
    assert list(MemoryAttachment.objects.values_list("store__name", flat=True)) == ["log"]


# --- create and edit through the admin's forms -----------------------------------------
ADD = "/admin/memory_stores/memorystore/add/"


def store_form(owner, name: str, type: str, config: str = "", rows: list[dict] | None = None):
    """The add page's POST: the store's fields and its attachment rows (formset)."""
    data = {"owner": owner.pk, "name": name, "type": type, "config": config}
    return {**data, **attachment_rows(rows or [])}


def attachment_rows(rows: list[dict], initial: int = 0) -> dict:
    data = {
        "attachments-TOTAL_FORMS": str(len(rows)),
        "attachments-INITIAL_FORMS": str(initial),
        "attachments-MIN_NUM_FORMS": "0",
        "attachments-MAX_NUM_FORMS": "1000",
    }
    for n, row in enumerate(rows):
        row = {"position": 0, "top_k": 3, "similarity_threshold": -1, "read": "on", **row}
        for key, value in row.items():
            if value is not None:
                data[f"attachments-{n}-{key}"] = value
    return data


def form_errors(response) -> dict[str, list[str]]:
    """The errors on the page's store form and each attachment row, as shown."""
    assert response.status_code == 200, response.status_code
    context = response.context
    errors = {k: list(v) for k, v in context["adminform"].form.errors.items()}
    for formset in context["inline_admin_formsets"]:
        errors.update(
            {"rows": list(formset.formset.non_form_errors())}
            if formset.formset.non_form_errors()
            else {}
        )
        for n, form in enumerate(formset.formset.forms):
            errors.update({f"rows[{n}].{k}": list(v) for k, v in form.errors.items()})
    return errors


def everything() -> dict:
    from knowledge.models import Chunk, KnowledgeBase
    from tests.memories.stores.conftest import snapshot_db

    return {
        **snapshot_db(),
        "bases": list(KnowledgeBase.objects.order_by("pk").values()),
        "chunks": Chunk.objects.count(),
    }


def test_the_add_page_offers_the_registered_types(admin_client):
    page = admin_client.get(ADD).content.decode()
    assert '<option value="simple">simple</option>' in page
    assert '<option value="file">file (read-only)</option>' in page
    assert '<option value="blackboard">blackboard</option>' in page
    assert "<dt>blackboard</dt>" in page and "max_items = 1000, max_age" in page  # the reference
    assert "${API_KEY}" in page  # how to reference a key


@pytest.mark.parametrize(
    "what,name,type,config,errors",
    [
        (
            "bad config fields",
            "notes",
            "simple",
            "max_items: 0\ncolour: red\n",
            {
                "config": [
                    "max_items: Ensure this value is greater than or equal to 1.",
                    "colour: unknown field",
                ]
            },
        ),
        (
            "not YAML",
            "notes",
            "simple",
            "max_items: [1,\n",
            {"config": ["Not YAML or JSON"]},
        ),
        ("not a mapping", "notes", "simple", "- 1\n- 2\n", {"config": ["The config is a mapping"]}),
        (
            "a literal key",
            "notes",
            "simple",
            '{"embedding": {"provider": "openai", "api_key": "sk-123"}}',
            {
                "config": [
                    "embedding.api_key: must be an environment reference like ${API_KEY} "
                    "(keys are not stored)"
                ]
            },
        ),
        (
            "bad name",
            "has space",
            "simple",
            "",
            {"name": ["1-100 letters, digits and . _ -, starting with a letter or digit"]},
        ),
        ("unknown type", "notes", "vector", "", {"type": ["Select a valid choice."]}),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_a_bad_store_is_shown_on_the_form_and_nothing_saved(
    admin_client, alice, what, name, type, config, errors
):
    before = everything()
    response = admin_client.post(ADD, store_form(alice, name, type, config))
    shown = form_errors(response)
    assert set(shown) == set(errors)
    for field, expected in errors.items():
        assert len(shown[field]) == len(expected)
        for message, start in zip(shown[field], expected):
            assert message.startswith(start), message
    assert everything() == before


def test_a_yaml_alias_bomb_is_shown_on_the_form_and_nothing_saved(admin_client, alice):
    before = everything()
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    response = admin_client.post(ADD, store_form(alice, "notes", "blackboard", "\n".join(levels)))
    assert form_errors(response) == {
        "config": [
            "Not YAML or JSON: YAML aliases may repeat at most 20,000 values in all;"
            " these repeat 12,345,660."
        ]
    }
    assert everything() == before


def test_a_taken_name_and_an_unset_variable_are_shown_on_the_form(
    admin_client, alice, docs_root, monkeypatch, stores
):
    before = everything()
    taken = admin_client.post(ADD, store_form(alice, "notes", "blackboard"))
    assert form_errors(taken) == {"name": ["a memory store named 'notes' already exists"]}
    monkeypatch.delenv("DOCS_KEY", raising=False)
    config = (
        "file_sources:\n  - path: docs\n    file_types: [.md]\nembedding:\n  provider: openai\n"
        "  model: text-embedding-3-small\n  api_key: ${DOCS_KEY}\n  base_url: http://127.0.0.1:9/v1\n"
    )
    unset = admin_client.post(ADD, store_form(alice, "docs", "file", config))
    assert form_errors(unset) == {
        "config": ["environment variable DOCS_KEY is not set (referenced by a memory store)"]
    }
    assert everything() == before


def test_an_operator_adds_a_store_with_its_attachments(
    admin_client, alice, flow, embed_server, django_capture_on_commit_callbacks
):
    config = (
        "max_items: 50\nembedding:\n  provider: openai\n  model: text-embedding-3-small\n"
        f"  api_key: ${{API_KEY}}\n  base_url: {embed_server.base_url}\n"
    )
    rows = [
        {
            "flow": flow.pk,
            "node_id": "writer",
            "retrieve_stage": ["gen", "critique"],
            "write": "on",
        },
        {"flow": flow.pk, "node_id": "critic", "top_k": 7, "similarity_threshold": 0.4},
    ]
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(ADD, store_form(alice, "convo", "simple", config, rows))
    assert response.status_code == 302, form_errors(response)
    store = MemoryStore.objects.get(name="convo")
    assert store.owner == alice and store.type == "simple"
    assert store.config["max_items"] == 50
    assert store.config["embedding"]["api_key"] == "${API_KEY}"  # kept unresolved
    assert (store.embedding_provider, store.embedding_dimensions) == ("openai", 1536)
    attached = MemoryAttachment.objects.filter(store=store).order_by("node_id")
    assert [
        (a.node_id, a.retrieve_stage, a.top_k, a.similarity_threshold, a.read, a.write)
        for a in attached
    ] == [("critic", [], 7, 0.4, True, False), ("writer", ["gen", "critique"], 3, -1.0, True, True)]
    # The node works at once: written through the API, found by the admin's list.
    written = node_memory_write(
        flow=flow,
        node_id="writer",
        input="What is the cache TTL?",
        output="The cache keeps entries for ten minutes.",
    )
    assert [w.result.action for w in written] == ["added"]


def test_an_operator_adds_a_file_store_and_it_is_indexed_after_the_commit(
    admin_client, alice, flow, docs_root, django_capture_on_commit_callbacks
):
    config = '{"file_sources": [{"path": "docs", "file_types": [".md"]}]}'
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            ADD, store_form(alice, "docs", "file", config, [{"flow": flow.pk, "node_id": "answer"}])
        )
        assert response.status_code == 302, form_errors(response)
        assert MemoryStore.objects.get(name="docs").knowledge_base.chunk_count == 0  # not yet
    # (The page's message saying so is checked in the browser: here the callbacks run
    # after the response, as the test's transaction never commits.)
    store = MemoryStore.objects.get(name="docs")
    assert store.knowledge_base.chunk_count == 2
    assert list(MemoryAttachment.objects.values_list("node_id", "write")) == [("answer", False)]


@pytest.mark.parametrize(
    "what,row,errors",
    [
        (
            "write on a read-only store",
            {"write": "on"},
            {"rows[0].write": ["store 'docs' is read-only: set write: false"]},
        ),
        (
            "unknown stage",
            {"retrieve_stage": ["gen", "review"]},
            {"rows[0].retrieve_stage": ['"review" is not a valid choice.']},
        ),
        (
            "top_k out of range",
            {"top_k": 0},
            {"rows[0].top_k": ["Ensure this value is greater than or equal to 1."]},
        ),
        (
            "threshold out of range",
            {"similarity_threshold": 1.5},
            {"rows[0].similarity_threshold": ["Ensure this value is less than or equal to 1.0."]},
        ),
        ("bad node id", {"node_id": "has space"}, {"rows[0].node_id": [NODE_ID_MESSAGE]}),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_a_bad_attachment_is_shown_on_its_row_and_nothing_saved(
    admin_client, alice, flow, docs_root, what, row, errors
):
    before = everything()
    config = '{"file_sources": [{"path": "docs"}]}'
    response = admin_client.post(
        ADD,
        store_form(alice, "docs", "file", config, [{"flow": flow.pk, "node_id": "answer", **row}]),
    )
    assert form_errors(response) == errors
    assert everything() == before


def test_an_attachment_twice_on_a_node_or_on_another_owners_flow_is_refused(
    admin_client, alice, bob, flow
):
    from memories.conversations.services import flow_create

    before = everything()
    twice = [{"flow": flow.pk, "node_id": "n1"}, {"flow": flow.pk, "node_id": "n1", "top_k": 4}]
    response = admin_client.post(ADD, store_form(alice, "notes2", "simple", "", twice))
    assert form_errors(response) == {"rows": ["store 'notes2' is attached twice to this node"]}
    bobs = flow_create(owner=bob, name="bobs-flow")
    response = admin_client.post(
        ADD, store_form(alice, "notes2", "simple", "", [{"flow": bobs.pk, "node_id": "n1"}])
    )
    assert form_errors(response) == {"rows[0].flow": ["flow 'bobs-flow' is not the store owner's"]}
    assert everything() == {**before, "stores": before["stores"]}
    assert not MemoryStore.objects.filter(name="notes2").exists()


def test_an_operator_edits_a_config_and_the_attachments(admin_client, stores, flow):
    notes = stores["notes"]
    url = f"/admin/memory_stores/memorystore/{notes.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "max_items: 1000" in page  # the config as YAML text
    existing = MemoryAttachment.objects.get(store=notes)
    rows = [
        {
            "id": existing.pk,
            "store": notes.pk,
            "flow": flow.pk,
            "node_id": "n1",
            "top_k": 9,
            "write": "on",
        },
        {"store": notes.pk, "flow": flow.pk, "node_id": "n2", "retrieve_stage": ["pre"]},
    ]
    data = {"config": "max_items: 2\nmin_content_length: 10\n", **attachment_rows(rows, initial=1)}
    response = admin_client.post(url, data)
    assert response.status_code == 302, form_errors(response)
    notes.refresh_from_db()
    assert notes.config["max_items"] == 2 and notes.config["min_content_length"] == 10
    assert sorted(
        MemoryAttachment.objects.filter(store=notes).values_list(
            "node_id", "top_k", "retrieve_stage", "write"
        )
    ) == [("n1", 9, [], True), ("n2", 3, ["pre"], False)]


def test_an_embedding_change_on_a_store_with_items_is_refused_on_the_form(admin_client, stores):
    notes = stores["notes"]
    url = f"/admin/memory_stores/memorystore/{notes.pk}/change/"
    before = everything()
    existing = MemoryAttachment.objects.get(store=notes)
    data = {
        "config": "embedding: {provider: hashing, params: {dimensions: 64}}\n",
        **attachment_rows(
            [
                {
                    "id": existing.pk,
                    "store": notes.pk,
                    "flow": existing.flow_id,
                    "node_id": "n1",
                    "write": "on",
                }
            ],
            initial=1,
        ),
    }
    response = admin_client.post(url, data)
    assert form_errors(response) == {
        "config": [
            "store 'notes' holds 3 items embedded with hashing/hashing-v1 (384 dims); delete its "
            "items (or the store) before changing its embedding"
        ]
    }
    assert everything() == before
