"""Each owner's switches of the engine (``EngineSettings``): its daily dream (on unless
turned off) and the chat proxy's memory tools for its end users' chats (off unless turned
on). An owner without a row has the defaults; what a deployment once set for every owner
(``ENGINE_DREAM_SCHEDULE``, ``CHAT_MEMORY_TOOLS``) is each owner's to choose."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from memories.engine.models import EngineSettings
from memories.facts.scopes import owner_pk


def engine_settings_get(*, owner: AbstractBaseUser | int) -> EngineSettings:
    """The owner's engine settings: its row, or an unsaved one with the defaults."""
    pk = owner_pk(owner)
    return EngineSettings.objects.filter(owner_id=pk).first() or EngineSettings(owner_id=pk)


def dream_schedule_enabled(*, owner: AbstractBaseUser | int) -> bool:
    return engine_settings_get(owner=owner).dream_schedule


def memory_tools_enabled(*, owner: AbstractBaseUser | int) -> bool:
    """Whether the owner's chats get the proxy's memory tools when a request does not say."""
    return engine_settings_get(owner=owner).memory_tools


def engine_settings_update(
    *, owner: AbstractBaseUser | int, dream_schedule: bool | None = None,
    memory_tools: bool | None = None,
) -> EngineSettings:  # fmt: skip
    """Turn the owner's daily dream, or its chats' memory tools, on or off (a switch not
    given keeps its value)."""
    changes = {"dream_schedule": dream_schedule, "memory_tools": memory_tools}
    row, _ = EngineSettings.objects.update_or_create(
        owner_id=owner_pk(owner), defaults={k: v for k, v in changes.items() if v is not None}
    )
    return row
