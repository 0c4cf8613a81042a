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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import IntegrityError, transaction
from django.db.models import F
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


def counter_add(name: str, amount: int = 1) -> None:
    """Raise the counter ``name`` by ``amount`` (one statement, in the caller's
    transaction if it holds one; the row is created on first use, race-safe)."""
    if amount == 0:
        return
    MetricCounter = _model()
    updated = MetricCounter.objects.filter(name=name).update(value=F("value") + amount)
    if not updated:
        try:
            with transaction.atomic():
                MetricCounter.objects.create(name=name, value=amount)
        except IntegrityError:
            MetricCounter.objects.filter(name=name).update(value=F("value") + amount)


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
    return "\n".join(lines) + "\n"
