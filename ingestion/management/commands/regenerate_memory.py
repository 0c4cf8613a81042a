from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from ingestion.memory_bases import session_ingest_run
from memories.bases.models import MemoryBase
from memories.bases.selectors import memory_base_chunk_state, memory_base_sessions
from memories.bases.services import memory_base_regenerate


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


class Command(BaseCommand):
    help = (
        "Rebuild a memory base's knowledge base from its captured messages: reset the "
        "session cursors, clear the chunks and re-ingest from the start."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "memory_base", help="Memory base id, or name (with --owner if ambiguous)."
        )
        parser.add_argument("--owner", help="Username of the owner, to resolve a name.")
        parser.add_argument("--session", help="Only this session.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Show what would be rebuilt; change nothing."
        )

    def handle(
        self,
        *args: Any,
        memory_base: str,
        owner: str | None,
        session: str | None,
        dry_run: bool,
        **options: Any,
    ) -> None:
        mb = self._resolve(memory_base, owner)
        sessions = list(memory_base_sessions(memory_base=mb))
        if session is not None:
            sessions = [s for s in sessions if s.session_id == session]
            if not sessions:
                raise CommandError(f"Memory base {mb.name!r} has no session {session!r}.")
        counted = memory_base_chunk_state(memory_base=mb)
        state = "MISMATCH (chunks missing)" if counted.mismatch else "consistent"
        self.stdout.write(f"Memory base {mb.name} ({mb.pk}): {counted.chunks} chunks, {state}")
        for s in sessions:
            lost = "  MISMATCH (its chunks are gone)" if s.lost else ""
            self.stdout.write(
                f"  session {s.session_id}: processed={s.total_processed} pending={s.pending}{lost}"
            )
        if dry_run:
            total = sum(s.total_processed + s.pending for s in sessions)
            self.stdout.write(
                f"Dry run: would clear {'session ' + session if session else 'all'} chunks and "
                f"re-ingest {total} message(s) in {len(sessions)} session(s). Nothing changed."
            )
            return
        try:
            jobs = memory_base_regenerate(
                memory_base=mb,
                session_id=session,
                run_with=session_ingest_run,
                progress=self._progress,
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write("")
        failed = [job for job in jobs if job.status != "succeeded"]
        processed = sum(job.messages_processed for job in jobs)
        chunks = memory_base_chunk_state(memory_base=mb).chunks
        self.stdout.write(f"Regenerated: {processed} message(s), {chunks} chunks.")
        if failed:
            raise CommandError(
                "; ".join(f"{job.session.session_id}: {job.status} {job.error}" for job in failed)
            )

    def _progress(self, session_id: str, done: int, total: int) -> None:
        self.stdout.write(f"\r  {session_id} {_bar(done, total)}", ending="")
        self.stdout.flush()

    def _resolve(self, value: str, owner: str | None) -> MemoryBase:
        qs = MemoryBase.objects.select_related("knowledge_base")
        if owner:  # (an id of another owner's base is no base of this owner's either)
            qs = qs.filter(owner__username=owner)
        try:
            return qs.get(pk=uuid.UUID(value))
        except (ValueError, MemoryBase.DoesNotExist):
            pass
        matches = qs.filter(name=value)
        found = list(matches[:2])
        if not found:
            raise CommandError(f"No memory base {value!r}.")
        if len(found) > 1:
            raise CommandError(f"Several owners have a memory base named {value!r}; pass --owner.")
        return found[0]
