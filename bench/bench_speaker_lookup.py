"""The speaker lookup of a search (is a capitalised query word a sender of the base's
turns?) with and without its ``ORDER BY`` (a4ec04f), paired per statement on the LoCoMo
bases ``bench/bench_retrieval.py`` builds (run that first):

    MEMORY_DATA_DIR=/work/benchdata EMBEDDED_DB_NAME=bench_retrieval \\
        .venv/bin/python bench/bench_speaker_lookup.py
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("EMBEDDED_DB_NAME", "bench_retrieval")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
import django  # noqa: E402

django.setup()
from django.db import connection, transaction

from core import tenancy
from knowledge import search
from knowledge.models import KnowledgeBase

new = search._SHARES_SQL
old = new.replace("    ORDER BY c.knowledge_base_id, c.sender\n", "")
assert old != new
with tenancy.bypass("bench"):
    kbs = [kb for kb in KnowledgeBase.objects.all() if kb.name.startswith("locomo-conv")]
words = [["Caroline", "Zebulon"], ["Melanie"], ["Gina", "Jon", "Paris"], ["Sweden"]]
ratios = []
for rep in range(60):
    for kb in kbs:
        ids = [str(kb.pk)]
        for w in words:
            params = [w, ids, ids, "english", ids]
            times = {}
            for name, sql in (
                (("old", old), ("new", new)) if rep % 2 else (("new", new), ("old", old))
            ):
                with (
                    tenancy.as_owner(kb.owner_id),
                    transaction.atomic(),
                    connection.cursor() as cur,
                ):
                    cur.execute("SET LOCAL enable_seqscan = off")
                    t = time.perf_counter()
                    cur.execute(sql, params)
                    cur.fetchall()
                    times[name] = time.perf_counter() - t
            ratios.append(times["new"] / times["old"])
print(len(ratios), "paired; median new/old", round(statistics.median(ratios), 3))
