"""The admin's memory-base pages at the size the admin audit found slow: the list of 300
memory bases (each with a few sessions) and the change page of one memory base with
2,000 sessions, all with messages waiting. Times a logged-in GET of each (Django's test
client, in process: the server's time, no network) and reports the median and the
page's size.

    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench_admin \\
        .venv/bin/python bench/bench_admin_pages.py [--runs 15]

The data is made once (about a minute) and kept in that database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_admin")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.bench_db import as_operator, migrate_if_needed  # noqa: E402

BASES = 300
SESSIONS_EACH = 4
BIG_SESSIONS = 2000


def _data() -> tuple[str, str]:
    """(the list's URL, the big memory base's change URL), making the data if missing."""
    from memories.bases.models import MemoryBase, MemoryBaseSession
    from memories.bases.services import memory_base_create
    from memories.conversations.models import Message
    from memories.conversations.services import flow_create

    users = get_user_model().objects
    if not users.filter(username="bench-admin").exists():
        users.create_superuser("bench-admin", "a@example.com", "bench-admin-password")
        owner = users.create_user("bench-owner")
        print(f"making {BASES} memory bases, one with {BIG_SESSIONS} sessions ...", flush=True)
        now = timezone.now()
        for n in range(BASES):
            with transaction.atomic():
                flow = flow_create(owner=owner, name=f"flow-{n}")
                mb = memory_base_create(owner=owner, name=f"base-{n}", flow=flow, threshold=1000)
                count = BIG_SESSIONS if n == 0 else SESSIONS_EACH
                MemoryBaseSession.objects.bulk_create(
                    MemoryBaseSession(memory_base=mb, session_id=f"s{i}") for i in range(count)
                )
                Message.objects.bulk_create(
                    Message(owner=owner, flow=flow, session_id=f"s{i}", role="assistant",
                            is_output=True, text=f"answer {i}.{j}", created_at=now)
                    for i in range(count) for j in range(2)
                )  # fmt: skip
    big = MemoryBase.objects.get(name="base-0")
    return "/admin/memory_bases/memorybase/", f"/admin/memory_bases/memorybase/{big.pk}/change/"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    migrate_if_needed()
    as_operator(__file__)
    listing, change = _data()
    settings.ALLOWED_HOSTS = ["*"]
    client = Client()
    assert client.login(username="bench-admin", password="bench-admin-password")
    for name, url in (("memory-base list (300 bases)", listing),
                      ("memory base with 2,000 sessions", change)):  # fmt: skip
        times, size = [], 0
        for _ in range(args.runs + 1):
            started = time.perf_counter()
            response = client.get(url)
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.status_code
            size = len(response.content)
            times.append(elapsed)
        times = times[1:]  # (the first fills caches)
        print(f"{name}: median {statistics.median(times) * 1000:.0f} ms, "
              f"min {min(times) * 1000:.0f} ms over {args.runs} runs, {size / 1024:.0f} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
