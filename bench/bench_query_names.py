"""What finding the query's names costs (``knowledge.search.query_names``): the statement
of today, which also looks each capitalised word up among the turns' senders, against the
one before senders counted (01a1b40: the lexemes' shares only, kept here as ``BEFORE``).

LoCoMo dev's questions that hold a capitalised word past their first, on the bases
``bench_retrieval.py`` builds (``--protocol sessions`` or ``senders``), each statement run
in turn with the other first every other time, ``--rounds`` times; under the bases'
owner, as a request runs (row-level security on). Prints the p50 of each and the median of
the paired ratios (now / before).

    MEMORY_DATA_DIR=... .venv/bin/python bench/bench_query_names.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_retrieval as br  # noqa: E402  (sets Django up, on the database bench_retrieval)

from core import tenancy  # noqa: E402
from knowledge import search  # noqa: E402
from knowledge.retrieval.db import fetch  # noqa: E402

BEFORE = """
SELECT w.word, coalesce(max(s.df::float8 / t.n), 0)
FROM unnest(%s::text[]) AS w(word)
CROSS JOIN (
    SELECT greatest(coalesce(sum(chunks), 0), 1)::float8 AS n
    FROM knowledge_base_text_stats WHERE knowledge_base_id = ANY(%s::uuid[])
) t
LEFT JOIN LATERAL (
    SELECT sum(df) AS df FROM knowledge_term_stats
    WHERE knowledge_base_id = ANY(%s::uuid[])
      AND lexeme = ANY(tsvector_to_array(to_tsvector(%s::regconfig, w.word)))
) s ON true
GROUP BY w.word
"""


def before(kb, text: str) -> None:
    names = sorted({m.group(1) for m in search._NAME.finditer(text)})
    ids = [str(kb.pk)]
    fetch(BEFORE, [names, ids, ids, kb.language])


def now(kb, text: str) -> None:
    search.query_names([kb], text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", type=Path, default=br.DEFAULT_DATA)
    parser.add_argument("--protocol", choices=("sessions", "senders"), default="sessions")
    args = parser.parse_args()
    owner = br.bench_owner("bench-retrieval")
    asked = []
    for conv in br.load(args.data, None, protocol=args.protocol):
        kb = br.ensure_base(owner, conv, False)
        asked += [(kb, q.text) for q in conv.questions if search._NAME.search(q.text)]
    took: dict[object, list[float]] = {before: [], now: []}
    ratios = []
    with tenancy.as_owner(owner.pk):
        for kb, text in asked[:30]:  # (warm: prepared, cached)
            before(kb, text)
            now(kb, text)
        for turn in range(args.rounds):
            for i, (kb, text) in enumerate(asked):
                pair = {}
                for fn in (before, now) if (i + turn) % 2 == 0 else (now, before):
                    started = time.perf_counter()
                    fn(kb, text)
                    pair[fn] = (time.perf_counter() - started) * 1000
                took[before].append(pair[before])
                took[now].append(pair[now])
                ratios.append(pair[now] / pair[before])
    print(
        f"{len(asked)} questions with a name, {args.rounds} rounds, protocol {args.protocol}: "
        f"before p50 {statistics.median(took[before]):.3f} ms, "
        f"now p50 {statistics.median(took[now]):.3f} ms, "
        f"median of the paired ratios {statistics.median(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
