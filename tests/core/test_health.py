from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from core import health
from core.health import pgvector_supports_iterative_scan
from core.qcluster import LocalSupervisor, local_supervisors, sweep_stale_states

pytestmark = pytest.mark.django_db


def test_healthz_reports_database_and_pgvector(alice_client):
    response = alice_client.get("/healthz")  # the full report needs a key
    assert response.status_code == 200
    body = response.json()
    assert body["database"]["status"] == "ok"
    assert body["database"]["version"].startswith("PostgreSQL")
    assert body["pgvector"] == {"status": "ok", "version": "0.8.2", "iterative_scan": True}
    # No worker runs during the unit tests: reported, not fatal.
    assert body["worker"]["status"] == "down"
    assert body["status"] == "degraded"


def test_healthz_is_public_and_get_only(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.8.2", True),
        ("0.8.0", True),
        ("0.10.1", True),
        ("0.7.4", False),
        ("0.5.1", False),
        (None, False),
    ],
)
def test_iterative_scan_detection(version, expected):
    assert pgvector_supports_iterative_scan(version) is expected


# --- this host's worker (docs/operations.md, "Many hosts") ------------------------------
class FakeStat:
    """A cluster's heartbeat, as django-q2's ``Stat.get_all`` returns it."""

    def __init__(self, pid: int, host: str | None = None) -> None:
        self.pid, self.host = pid, host or socket.gethostname()
        self.cluster_id, self.status, self.workers = f"cluster-{pid}", "Idle", [1, 2]


def _supervisor_file(base: Path, pid: int, cluster_pid: int | None, *, alive: bool) -> Any:
    """A supervisor's file; held (as its live supervisor holds it) when ``alive``: a lock
    through another open file, which conflicts with the health check's as another
    process's would. Returns the descriptor to close."""
    path = base / f"supervisor-{pid}"
    path.write_text("" if cluster_pid is None else str(cluster_pid))
    if not alive:
        return None
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.fixture
def state_dir(settings, tmp_path, monkeypatch):
    settings.WORKER_STATE_DIR = tmp_path
    held: list[int] = []
    yield tmp_path, held
    for fd in held:
        os.close(fd)


def _with_stats(monkeypatch, *stats: FakeStat) -> None:
    monkeypatch.setattr(health.Stat, "get_all", staticmethod(lambda: list(stats)))


def test_a_host_without_a_worker_says_none(state_dir, monkeypatch):
    _with_stats(monkeypatch, FakeStat(4242, host="elsewhere"))  # another host's cluster
    host = health.worker_status()["host"]
    assert host == {"name": socket.gethostname(), "status": "none", "supervisors": []}


def test_a_live_supervisor_with_a_beating_cluster_is_ok(state_dir, monkeypatch):
    base, held = state_dir
    held.append(_supervisor_file(base, 100, 101, alive=True))
    _with_stats(monkeypatch, FakeStat(101), FakeStat(555, host="elsewhere"))
    status = health.worker_status()
    assert status["host"]["status"] == "ok"
    assert status["host"]["supervisors"] == [
        {"pid": 100, "alive": True, "cluster_pid": 101, "cluster": "ok"}
    ]
    assert sorted((c["host"], c["pid"]) for c in status["clusters"]) == sorted(
        [(socket.gethostname(), 101), ("elsewhere", 555)]
    )


def test_another_hosts_cluster_with_the_same_pid_is_not_ours(state_dir, monkeypatch):
    base, held = state_dir
    held.append(_supervisor_file(base, 100, 101, alive=True))
    _with_stats(monkeypatch, FakeStat(101, host="elsewhere"))
    host = health.worker_status()["host"]
    assert host["status"] == "down"
    assert host["supervisors"][0]["cluster"] == "down"


def test_a_killed_supervisor_leaves_its_host_down_and_degraded(state_dir, monkeypatch):
    """Its file stays, its lock gone with the process: down, while another host's
    cluster keeps the deployment's background work ``ok``."""
    base, held = state_dir
    _supervisor_file(base, 100, 101, alive=False)
    _with_stats(monkeypatch, FakeStat(101), FakeStat(555, host="elsewhere"))
    monkeypatch.setattr(
        "core.qcluster.queue_figures",
        lambda: {"waiting": 0, "claimed": 0, "waiting_since": None, "oldest_waiting_seconds": 0.0,
                 "last_finished_at": None, "last_finished_seconds_ago": None},
    )  # fmt: skip
    healthy, report = health.health_report()
    assert healthy is True
    assert report["worker"]["status"] == "ok"
    assert report["worker"]["host"]["status"] == "down"
    assert report["worker"]["host"]["supervisors"] == [
        {"pid": 100, "alive": False, "cluster_pid": 101, "cluster": "down"}
    ]
    assert report["status"] == "degraded"


def test_a_supervisor_between_clusters_is_down(state_dir, monkeypatch):
    base, held = state_dir
    held.append(_supervisor_file(base, 100, None, alive=True))  # restarting its cluster
    _with_stats(monkeypatch)
    assert health.worker_status()["host"]["status"] == "down"


def test_the_public_report_says_this_hosts_worker_status(client, state_dir, monkeypatch):
    base, held = state_dir
    _supervisor_file(base, 100, 101, alive=False)
    body = client.get("/healthz").json()
    assert body["worker"] == {"status": "down", "host": {"status": "down"}}


def test_the_next_supervisor_sweeps_a_killed_ones_file_and_keeps_a_live_ones(state_dir):
    base, held = state_dir
    _supervisor_file(base, 100, 101, alive=False)
    held.append(_supervisor_file(base, 200, 201, alive=True))
    sweep_stale_states(base)
    assert sorted(p.name for p in base.iterdir()) == ["supervisor-200"]
    assert local_supervisors(base) == [LocalSupervisor(pid=200, alive=True, cluster_pid=201)]


def test_each_database_of_a_data_directory_has_its_own_worker_state(tmp_path):
    """Two deployments on one embedded server (two EMBEDDED_DB_NAMEs) must not read each
    other's supervisors: /healthz would call this host's worker down."""
    import subprocess
    import sys

    def state_dir(**env: str) -> str:
        code = (
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.WORKER_STATE_DIR)"
        )
        clean = {k: v for k, v in os.environ.items() if k not in {"TESTING", "EMBEDDED_DB_NAME"}}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**clean, "DJANGO_SETTINGS_MODULE": "memoryproject.settings",
                 "MEMORY_DATA_DIR": str(tmp_path), "MEMORY_ENV_FILE": "", **env},
        )  # fmt: skip
        return done.stdout.strip()

    assert state_dir() == str(tmp_path / "worker")  # the default database's, as before
    assert state_dir(EMBEDDED_DB_NAME="other") == str(tmp_path / "worker-other")
