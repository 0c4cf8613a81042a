"""``blackboard``: an append-only log without embeddings, trimmed by count and age."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from core.api.fields import StrictCharField, StrictIntegerField
from memories.stores.backends import sql
from memories.stores.backends.base import (
    RetrieveQuery,
    StoreBackend,
    StoreHit,
    WriteIn,
    WriteResult,
)
from memories.stores.backends.simple import IGNORED_PATH_HELP
from memories.stores.models import MemoryItem
from memories.stores.registry import StrictConfig
from memories.stores.search import Newest
from memories.stores.text import attachment_overview, turn_summary

_DURATION = re.compile(r"^(\d+)\s*([smhdw]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# The longest age a store keeps (100 years): "now - age" must stay a date Python has
# (1000000w once failed every read and write of its node with an OverflowError).
MAX_AGE = timedelta(days=36_500)


def parse_duration(value: Any) -> timedelta | None:
    """``"90"``/``90`` seconds, ``"15m"``, ``"12h"``, ``"7d"``, ``"2w"``, up to
    ``MAX_AGE``; empty: None."""
    if value in (None, ""):
        return None
    match = _DURATION.match(str(value).strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError("a positive duration like 3600, 90s, 15m, 12h, 7d or 2w")
    digits, unit = match.groups()
    if len(digits) > 12 or int(digits) * _UNITS[unit] > MAX_AGE.total_seconds():
        raise ValueError("at most 100 years (36500d)")
    return timedelta(seconds=int(digits) * _UNITS[unit])


class DurationField(StrictCharField):
    """A duration as text ("12h"), or a whole number of seconds (3600, as the docs write
    it): kept as text."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, int) and not isinstance(data, bool):
            data = str(data)
        return super().to_internal_value(data)


class BlackboardConfig(StrictConfig):
    memory_path = StrictCharField(
        required=False, allow_blank=True, default="", help_text=IGNORED_PATH_HELP
    )
    max_items = StrictIntegerField(
        min_value=1,
        max_value=1_000_000,
        default=1000,
        help_text="Oldest entries beyond are dropped",
    )
    max_age = DurationField(
        required=False,
        allow_blank=True,
        default="",
        help_text="Entries older than this are dropped: 3600, 90s, 15m, 12h, 7d, 2w",
    )

    def validate_max_age(self, value: str) -> str:
        try:
            parse_duration(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value.strip()


class BlackboardStore(StoreBackend):
    _newest: Newest | None = None  # this call's read, from prepare_retrieve

    def _oldest_kept(self) -> datetime | None:
        try:
            age = parse_duration(self.config.get("max_age"))
        except ValueError:  # (a config stored before the bound: the longest age)
            age = MAX_AGE
        return None if age is None else timezone.now() - age

    def prepare_retrieve(self, query: RetrieveQuery) -> None:
        # Entries past max_age are left out even before a write trims them. The read
        # goes in the call's one round trip; ``since`` is taken once, here.
        self._newest = Newest(str(self.store.pk), query.top_k, self._oldest_kept())
        if query.searches is not None:
            query.searches.add(self._newest)

    def retrieve(self, query: RetrieveQuery) -> list[StoreHit]:
        search = self._newest
        if search is None or search.limit != query.top_k:  # not prepared
            return sql.newest(self.store.pk, query.top_k, since=self._oldest_kept())
        if query.searches is not None:
            return query.searches.result(search)  # type: ignore[no-any-return]
        return sql.newest(search.store_id, search.limit, since=search.since)

    def update(self, write: WriteIn, prepared: Any) -> WriteResult:
        if not write.input.text.strip() and not write.output.text.strip():
            return WriteResult("skipped", reason="nothing to record")
        item = MemoryItem.objects.create(
            store=self.store,
            content_summary=turn_summary(write.input.text, write.output.text, max_chars=500),
            input_snapshot=write.input.as_dict(),
            output_snapshot=write.output.as_dict(),
            metadata=write.metadata  # (the service's key last: the caller cannot forge it)
            | {"attachments": attachment_overview(write.input, write.output)},
            session_id=write.session_id,
        )
        trimmed = sql.trim(
            self.store.pk, max_items=self.config["max_items"], before=self._oldest_kept()
        )
        return WriteResult("added", item_id=item.pk, trimmed=trimmed)
