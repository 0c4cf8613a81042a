"""The service's counters and gauges, as ``GET /metrics`` exposes them (Prometheus text;
the view is ``core.views.metrics``).

Each app lists what it exports in its ``AppConfig.metrics`` (as it lists its schedules):
``Counter`` (a name and its help; the value is the ``MetricCounter`` row of that name,
raised by ``counter_add``) and ``Gauge`` (a name, its help and the dotted path of a
function answering the current value). The platform renders them without importing
the rooms above it. (App configs import this module while apps load: it imports no
model at import time.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import connection
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class Counter:
    name: str
    help: str


@dataclass(frozen=True)
class Gauge:
    name: str
    help: str
    read: str  # dotted path of a function of no argument answering the value


def declared_counters() -> list[Counter]:
    return [m for c in apps.get_app_configs() for m in getattr(c, "metrics", ()) if isinstance(m, Counter)]  # fmt: skip


def declared_gauges() -> list[Gauge]:
    return [m for c in apps.get_app_configs() for m in getattr(c, "metrics", ()) if isinstance(m, Gauge)]  # fmt: skip


def _model() -> Any:
    from core.models import MetricCounter

    return MetricCounter


_UPSERT = (
    "INSERT INTO core_metriccounter (name, value) SELECT n, v FROM unnest(%s::varchar[], "
    "%s::bigint[]) u(n, v){no_wait} ON CONFLICT (name) DO UPDATE SET value = "
    "core_metriccounter.value + excluded.value"
)
# Outside a transaction the statement is a transaction of its own, which need not wait
# for its WAL to reach the disk (a crash may lose the last increments of a counter, not
# data): set_config(..., true) lasts until that transaction's commit.
_NO_WAIT = ", (SELECT set_config('synchronous_commit', 'off', true)) s"


def counters_add(amounts: Mapping[str, int]) -> None:
    """Raise each counter by its amount: one statement for them all (in the caller's
    transaction if it holds one, else committed without waiting for the disk; rows are
    created on first use, race-safe). Counter rows are shared by every request: raise
    them outside long transactions."""
    names = sorted(name for name, amount in amounts.items() if amount)  # (lock order)
    if names:
        sql = _UPSERT.format(no_wait="" if connection.in_atomic_block else _NO_WAIT)
        with connection.cursor() as cur:
            cur.execute(sql, [names, [amounts[name] for name in names]])


def counter_add(name: str, amount: int = 1) -> None:
    """Raise the counter ``name`` by ``amount`` (``counters_add``)."""
    counters_add({name: amount})


def counter_values() -> list[tuple[str, int]]:
    """Every declared counter and its value, in declaration order."""
    values = dict(_model().objects.values_list("name", "value"))
    return [(c.name, values.get(c.name, 0)) for c in declared_counters()]


def render_metrics() -> str:
    lines: list[str] = []

    def block(name: str, help_text: str, kind: str, value: int) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"])

    for gauge in declared_gauges():
        read: Callable[[], int] = import_string(gauge.read)
        block(gauge.name, gauge.help, "gauge", read())
    values = dict(counter_values())
    for counter in declared_counters():
        block(counter.name, counter.help, "counter", values[counter.name])
    lines.extend(_usage_lines())
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


USAGE_METRICS = (
    ("memory_usage_calls_total", "LLM and embedding calls, by kind of work and model.", "calls"),
    ("memory_usage_tokens_in_total", "Tokens sent to LLM and embedding providers.", "tokens_in"),
    ("memory_usage_tokens_out_total", "Tokens LLM providers answered with.", "tokens_out"),
    ("memory_usage_estimated_calls_total",
     "Calls whose provider sent no usage (their tokens counted with the tokenizer).",
     "estimated_calls"),
)  # fmt: skip


def _usage_lines() -> list[str]:
    """The usage counters (``core.usage``), labelled by kind and model (never by owner:
    their number stays bounded)."""
    from core.models import UsageTotal

    rows = [dict(r) for r in UsageTotal.objects.order_by("kind", "model").values()]
    lines: list[str] = []
    for name, help_text, column in USAGE_METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for row in rows:
            labels = f'kind="{_label(str(row["kind"]))}",model="{_label(str(row["model"]))}"'
            lines.append(f"{name}{{{labels}}} {row[column]}")
    return lines
