"""The admin index's formation health table (``templates/admin/index.html``)."""

from __future__ import annotations

from typing import Any

from django import template

from memories.engine.health import formation_health

register = template.Library()


@register.inclusion_tag("admin/memory_engine/formation_health.html")
def formation_health_table() -> dict[str, Any]:
    return {"owners": formation_health()}
