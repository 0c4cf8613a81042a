from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections, transaction
from django.test import TransactionTestCase
from rest_framework.test import APIClient

from core import tenancy
from core.db_backend.base import table_owner
from core.schedules import register_schedules
from core.services import api_key_create
from memories.bases.services import memory_base_create, messages_record
from memories.conversations.services import MessageIn, flow_create
from tests.browser import browser  # noqa: F401  (the admin's end-to-end tests' fixture)
from tests.factories import UserFactory
from tests.fakes.openai_server import FakeOpenAIServer
from tests.served import SERVED_MODULES, served_stop, shared_served  # noqa: F401  (tests/served.py)

# `make test` runs the suite on several test processes (pytest-xdist). Tests go out by
# unit: a module (its tests run on one process, in their order, as they would alone:
# module fixtures are set up once, and no test finds another module's state where it
# used to find its own module's), or the modules sharing the served instance
# (tests/served.py). What waits longest starts first, so that its waiting overlaps the
# rest: these modules, then every unit with a process test (``slow``), the browser tests,
# the rest, each rank in collection order.
START_FIRST = (
    "tests/ingestion/test_engine_updates_qcluster.py",  # django-q2's scheduler looks every 30 s
    "tests/core/test_self_healing.py",
    "tests/test_openapi_conformance.py",  # ~1,100 requests in one test
    "tests/core/test_local_minilm.py",
)


def _unit(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return "served" if module in SERVED_MODULES else module


def _rank(items: list[pytest.Item]) -> int:
    unit = _unit(items[0].nodeid)
    if unit in START_FIRST:
        return START_FIRST.index(unit)
    if any(item.get_closest_marker("slow") for item in items):
        return len(START_FIRST)
    if any(item.get_closest_marker("browser") for item in items):
        return len(START_FIRST) + 1
    return len(START_FIRST) + 2


@pytest.hookimpl(wrapper=True)  # after pytest-django's order (Django's) within a module
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    yield
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)
        if "shared_served" in getattr(item, "fixturenames", ()) and _unit(item.nodeid) != "served":
            raise pytest.UsageError(f"{item.nodeid}: add its module to SERVED_MODULES")
    ordered = sorted(units.values(), key=_rank)  # stable: collection order within a rank
    items[:] = [item for unit in ordered for item in unit]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Hand out whole units, in the order above (xdist's loadgroup cannot: it names its
    groups in a node id that pytest 9 no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or _unit(nextitem.nodeid) != "served":
        served_stop()  # the served modules' last test: nothing after it needs the instance


def pytest_sessionfinish() -> None:
    served_stop(wait=True)


# Rows that Django's flush truncates and post_migrate then writes back the same: kept.
_KEPT_TABLES = {"django_migrations", "django_content_type", "auth_permission"}


def _empty_every_table(self: TransactionTestCase) -> None:
    """The teardown of a transaction test (``TransactionTestCase._fixture_teardown``),
    in a tenth of the time.

    Django's flush truncates every table (each gets new files, its indexes rebuilt
    empty) and then runs post_migrate, which writes the content types, permissions and
    schedules back. Here one statement deletes the rows of every table of the schema
    (the trigger-kept side tables too, which Django's TRUNCATE empties through their
    TRUNCATE triggers), with triggers and foreign-key checks off for it
    (``session_replication_role``); the content types and permissions stay, and the
    schedules are registered again, as post_migrate would.
    """
    for name in self._databases_names(include_mirrors=False):
        empty_database(name)


def empty_database(name: str) -> None:
    connection = connections[name]
    # (as the tables' owner: the service's role may not turn triggers off)
    with table_owner(connection), transaction.atomic(using=name), connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        tables = sorted({row[0] for row in cursor.fetchall()} - _KEPT_TABLES)
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(";".join(f"DELETE FROM {connection.ops.quote_name(t)}" for t in tables))
    register_schedules(using=name)


TransactionTestCase._fixture_teardown = _empty_every_table  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):  # noqa: F811 (pytest-django's)
    """A test database kept from the last run (``make check``: ``--reuse-db``) starts
    empty too: a run stopped inside a transaction test left its rows."""
    with django_db_blocker.unblock():
        empty_database("default")


# A test's own code (its factories, the services it calls directly, its checks, the
# threads it starts) sees every owner's rows, as the admin does; what it drives through
# a request, a task or MCP runs as that one's owner or as nobody (core.tenancy), as it
# would when served: each of those sets what it runs as.
tenancy.set_fallback(("", "test"))


@pytest.fixture(autouse=True)
def _runs_as_the_tests_own() -> Iterator[None]:
    """Each test starts as its own code runs (every owner's rows), whatever a test before
    it left set in this thread, and leaves nothing set for the next."""
    token = tenancy.enter(("", "test"))
    yield
    tenancy.leave(token)


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


def jobs_logged(caplog) -> list[tuple[str, object, str]]:
    """What ``core.jobs`` logged (level, exc_info, message), once nothing logged an error."""
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []
    return [
        (r.levelname, r.exc_info, r.getMessage()) for r in caplog.records if r.name == "core.jobs"
    ]


def record(flow, session_id: str, *texts: str, run_id: str = "run", role: str = "assistant"):
    """Capture one run of ``texts`` (outputs unless ``role`` is user)."""
    return messages_record(
        flow=flow,
        session_id=session_id,
        run_id=run_id,
        messages=[MessageIn(role=role, text=t) for t in texts],
    )
