from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from memories.engine.dreams import dream_preview, dream_run, dream_undo
from memories.engine.models import Dream


class Command(BaseCommand):
    help = (
        "Deep Dream one scope now: consolidate its core facts with its last journal days "
        "(MEMORY.md rewritten, a diary entry written, every change audited and undoable). "
        "Or undo a dream with --undo DREAM_ID."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("owner", help="Username of the scope's owner.")
        parser.add_argument("scope", nargs="*", help='The scope\'s segments, e.g. "user alice".')
        parser.add_argument("--lookback-days", type=int, default=None,
                            help="Journal days to read (default ENGINE_DREAM_LOOKBACK_DAYS).")  # fmt: skip
        parser.add_argument("--dry-run", action="store_true",
                            help="Show what the dream would read; call nothing, change nothing.")  # fmt: skip
        parser.add_argument("--undo", metavar="DREAM_ID", help="Undo this dream instead.")

    def handle(self, *args: Any, owner: str, scope: list[str], lookback_days: int | None,
               dry_run: bool, undo: str | None, **options: Any) -> None:  # fmt: skip
        user = get_user_model().objects.filter(username=owner).first()
        if user is None:
            raise CommandError(f"No user {owner!r}.")
        try:
            if undo:
                undone = dream_undo(owner=user, dream_id=undo)
                self.stdout.write(
                    f"Undid dream {undone.pk}: {len(undone.changes)} changes reverted."
                )
                return
            if not scope:
                raise CommandError("Name the scope, e.g. `dream alice user alice`.")
            if dry_run:
                self._preview(user, scope, lookback_days)
                return
            outcome = dream_run(owner=user, scope=tuple(scope), lookback_days=lookback_days,
                                trigger=Dream.Trigger.COMMAND)  # fmt: skip
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        dream = outcome.dream
        if outcome.skipped:
            self.stdout.write(f"Unchanged since dream {dream.pk}: skipped (no LLM call).")
            return
        counts: dict[str, int] = {}
        for change in dream.changes:
            counts[change["action"]] = counts.get(change["action"], 0) + 1
        summary = ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "no change"
        self.stdout.write(
            f"Dream {dream.pk}: {summary}. Undo: manage.py dream {owner} --undo {dream.pk}"
        )

    def _preview(self, user: Any, scope: list[str], lookback_days: int | None) -> None:
        inputs = dream_preview(owner=user, scope=tuple(scope), lookback_days=lookback_days)
        self.stdout.write(
            f"{len(inputs.facts)} facts, journal days: {', '.join(inputs.days) or 'none'}"
        )
        if inputs.unchanged_since is not None:
            self.stdout.write(
                f"Unchanged since dream {inputs.unchanged_since.pk}: a dream would skip."
            )
        else:
            self.stdout.write("A dream would call the LLM once. (dry run: nothing changed)")
