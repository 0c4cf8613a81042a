"""HNSW indexes on 16-bit floats (``halfvec``): the migrations that build them (which
one a search orders by is ``knowledge.retrieval.hnsw.index_type``'s answer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def supports_halfvec(schema_editor: Any) -> bool:
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cur.fetchone()
    parts = [int(p) for p in (row[0] if row else "0").split(".")[:2] if p.isdigit()]
    return tuple(parts) >= (0, 7)


def halfvec_swap(
    *, table: str, prefix: str, dims: Sequence[int], ef_construction: int
) -> tuple[Callable[..., None], Callable[..., None]]:
    """(forward, backward) for ``RunPython(atomic=False)``: forward builds the partial
    ``halfvec`` HNSW index ``<prefix>_half_<dim>`` of each dimension concurrently and
    drops the ``vector`` one (``<prefix>_<dim>``); backward the reverse. On pgvector <
    0.7 (no ``halfvec``) forward changes nothing."""

    def build(schema_editor: Any, kind: str, name: str, ef: int, other: str) -> None:
        for dim in dims:
            schema_editor.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}_{dim} ON {table} USING hnsw "
                f"((embedding::{kind}({dim})) {kind}_cosine_ops) "
                f"WITH (m = 16, ef_construction = {ef}) WHERE dimensions = {dim}"
            )
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {other}_{dim}")

    def forward(apps: Any, schema_editor: Any) -> None:
        if supports_halfvec(schema_editor):
            build(schema_editor, "halfvec", f"{prefix}_half", ef_construction, prefix)

    def backward(apps: Any, schema_editor: Any) -> None:
        build(schema_editor, "vector", prefix, 64, f"{prefix}_half")

    return forward, backward
