"""The OpenAPI schema tells the truth: schemathesis generates requests for every
operation of /api/schema/ (data the schema allows, and data it forbids) and checks
every answer with all its checks: no 5xx, documented status codes, content types and
headers, bodies matching the documented schemas, valid data accepted, invalid data
rejected, ... (``scripts/faults/fuzz.py``)."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from core.api.schema import ROOM_TAGS
from core.services import api_key_create
from knowledge.services import DocumentIn, knowledge_base_create, knowledge_documents_submit
from memories.facts.scopes import end_user_ensure
from memoryproject.wsgi import application
from scripts.faults.fuzz import fuzz
from tests.conftest import record
from tests.memories.facts.seed import seed

pytestmark = pytest.mark.django_db
EXAMPLES = 5  # per operation and pass: ~1,100 requests, about a minute


@pytest.fixture
def wsgi_calls(db):
    # Calls go straight to the WSGI application, in the test's transaction: keep Django
    # from closing the test's connection at the end of each request (as its test
    # client does).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _known_ids(alice, memory_base) -> dict[str, object]:
    """Existing objects for a pass whose paths name them."""
    flow = memory_base.flow
    record(flow, "s1", "an answer worth keeping", run_id="r1")
    # (a base of the owner's own: a memory base's is read-only through the API)
    docs = knowledge_base_create(owner=alice, name="docs")
    knowledge_documents_submit(
        knowledge_base=docs,
        documents=[DocumentIn.from_payload(text="tea facts", source_key="d1")],
        background=False,
    )
    end_user = end_user_ensure(owner=alice, external_id="u1")
    (memory,) = seed(end_user, "likes tea", reason="test")
    key, _ = api_key_create(owner=alice, name="another")
    return {
        "flow_id": flow.pk,
        "mb_id": memory_base.pk,
        "kb_id": docs.pk,
        "session_id": "s1",
        "node_id": "n1",
        "user_id": "u1",
        "memory_id": memory.pk,
        "key_id": key.pk,
    }


def test_every_operation_conforms_to_the_schema(wsgi_calls, alice, memory_base, settings):
    settings.API_THROTTLE_RATE = ""
    _, key = api_key_create(owner=alice, name="schemathesis")
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    report = fuzz(
        schema,
        headers={"Authorization": f"Bearer {key}"},
        max_examples=EXAMPLES,
        known_ids=_known_ids(alice, memory_base),
    )
    failures = {op: sorted(titles) for op, titles in sorted(report.failures.items())}
    assert failures == {}, "\n".join(f"{k}\n  {v}" for k, v in report.examples.items())
    assert report.server_errors == 0
    # The key stays valid throughout (the pass on existing objects revokes another one):
    # most answers come from the views, not from authentication.
    assert report.statuses[401] < report.requests / 5, report.figures()
    assert report.statuses[200] + report.statuses[201] > 100, report.figures()
    assert report.operations >= 48


def test_schema_describes_auth_tags_summaries_and_errors(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert schema["components"]["securitySchemes"] == {
        "apiKey": {
            "type": "http",
            "scheme": "bearer",
            "description": schema["components"]["securitySchemes"]["apiKey"]["description"],
        }
    }
    operations = [
        (path, method, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in ("get", "post", "patch", "put", "delete")
    ]
    assert len(operations) >= 48
    tags = {op["tags"][0] for _, _, op in operations}
    assert {"Accounts", "Knowledge bases", "Memory bases", "Capture", "Conversations"} <= tags
    auto = {"Get", "Create", "Update", "Replace", "Delete"}
    for path, method, op in operations:
        assert op.get("summary"), (method, path)
        # Written for each operation, not made from its method and path ("Create mcp").
        words = op["summary"].split()
        last = path.rstrip("/").split("/")[-1].replace("-", " ")
        assert not (words[0] in auto and " ".join(words[1:]) == last), (method, path, op["summary"])
        assert op["tags"][0] in ROOM_TAGS.values(), (method, path, op["tags"])
        assert op["security"] == [{"apiKey": []}], (method, path)
        assert {"400", "401", "429", "503"} <= set(op["responses"]), (method, path)
        shape = "OpenAIError" if path.startswith("/v1/") else "Error"
        assert op["responses"]["401"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{shape}"
        }
    kb_list = schema["paths"]["/api/v1/knowledge-bases"]["get"]["responses"]["200"]
    ref = kb_list["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][ref]["properties"]) == {
        "count",
        "next",
        "previous",
        "results",
    }
    assert set(schema["paths"]["/api/v1/api-keys/{key_id}"]["delete"]["responses"]) >= {"200"}
    documents = schema["paths"]["/api/v1/knowledge-bases/{kb_id}/documents"]["post"]
    assert {"201", "202"} <= set(documents["responses"])
