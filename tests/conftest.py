from __future__ import annotations

from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from core.services import api_key_create
from ingestion.capture import messages_record
from memories.bases.services import memory_base_create
from memories.conversations.services import MessageIn, flow_create
from tests.browser import browser  # noqa: F401  (the admin's end-to-end tests' fixture)
from tests.factories import UserFactory
from tests.fakes.openai_server import FakeOpenAIServer


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def bob(db):
    return UserFactory(username="bob")


def _client_for(user) -> APIClient:
    _, raw_key = api_key_create(owner=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def alice_client(alice) -> APIClient:
    return _client_for(alice)


@pytest.fixture
def bob_client(bob) -> APIClient:
    return _client_for(bob)


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def llm_settings(settings, openai_server):
    """Point the chat LLM at the loopback fake."""
    settings.LLM_BASE_URL = openai_server.base_url
    settings.LLM_MODEL = "fake-model"
    settings.LLM_API_KEY = "sk-test"
    settings.LLM_TIMEOUT = 2.0
    return settings


@pytest.fixture
def flow(alice):
    return flow_create(owner=alice, name="support-bot")


@pytest.fixture
def memory_base(alice, flow):
    return memory_base_create(owner=alice, name="support-memory", flow=flow, threshold=3)


def record(flow, session_id: str, *texts: str, run_id: str = "run", role: str = "assistant"):
    """Capture one run of ``texts`` (outputs unless ``role`` is user)."""
    return messages_record(
        flow=flow,
        session_id=session_id,
        run_id=run_id,
        messages=[MessageIn(role=role, text=t) for t in texts],
    )
