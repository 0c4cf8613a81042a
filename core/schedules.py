"""The one place django-q2 schedules are registered.

Each app lists its schedules in its ``AppConfig.schedules``; after every ``migrate``
(``post_migrate``) they are written by name with ``update_or_create``, so running it
again changes nothing and a changed interval or task path is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.apps import AppConfig, apps


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    func: str
    schedule_type: str  # django_q.models.Schedule.MINUTES ("I"), DAILY ("D"), ...
    minutes: int | None = None


def declared_schedules() -> list[ScheduleSpec]:
    return [spec for config in apps.get_app_configs() for spec in getattr(config, "schedules", ())]


def register_schedules(sender: AppConfig | None = None, **kwargs: Any) -> None:
    """``post_migrate`` receiver: create or update every declared schedule by name."""
    from django.db import DEFAULT_DB_ALIAS
    from django_q.models import Schedule

    using = kwargs.get("using", DEFAULT_DB_ALIAS)
    for spec in declared_schedules():
        Schedule.objects.using(using).update_or_create(
            name=spec.name,
            defaults={
                "func": spec.func,
                "schedule_type": spec.schedule_type,
                "minutes": spec.minutes,
                "repeats": -1,
            },
        )
