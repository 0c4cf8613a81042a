from __future__ import annotations

import codecs
import uuid
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from knowledge.files import FileEvent, IndexReport, knowledge_base_index_files
from knowledge.models import KnowledgeBase
from knowledge.services import KnowledgeError, knowledge_base_create


class Command(BaseCommand):
    help = (
        "Index files and directories into a file-backed knowledge base. Only files whose "
        "content changed are re-embedded; chunks of files deleted under the given paths "
        "are removed. Prints one line per file and a summary."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kb", help="Knowledge base id or name.")
        parser.add_argument("paths", nargs="+", type=Path, help="Files or directories.")
        parser.add_argument(
            "--owner", help="Username owning the base (needed when a name is ambiguous)."
        )
        parser.add_argument(
            "--suffix",
            action="append",
            dest="suffixes",
            default=None,
            help="Only index files with this suffix (repeatable, e.g. --suffix .md).",
        )
        parser.add_argument(
            "--no-recursive",
            action="store_false",
            dest="recursive",
            help="Do not descend into subdirectories.",
        )
        parser.add_argument("--encoding", default="utf-8", help="Text encoding of the files.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would change; write nothing."
        )
        parser.add_argument(
            "--create",
            action="store_true",
            help="Create a file-backed base with this name for --owner if it does not exist.",
        )

    def handle(
        self,
        *args: Any,
        kb: str,
        paths: list[Path],
        owner: str | None,
        suffixes: list[str] | None,
        recursive: bool,
        encoding: str,
        dry_run: bool,
        create: bool,
        **options: Any,
    ) -> None:
        for path in paths:
            if not path.expanduser().exists():
                raise CommandError(f"Path does not exist: {path}")
        try:  # (checked before --create makes the base: a refusal changes nothing)
            codecs.lookup(encoding)
        except LookupError:
            raise CommandError(f"unknown encoding {encoding!r}") from None
        user = _user(owner) if owner else None
        if not dry_run:
            # No surrounding transaction: embedding calls must not hold one open, and
            # each batch of files commits on its own.
            base = self._base(kb, user, create=create, dry_run=False)
            report = self._index(base, paths, suffixes, recursive, encoding, dry_run=False)
        else:
            # A dry run never embeds; with --create it makes the base in a transaction
            # rolled back at the end, so the report comes from the same code path.
            with transaction.atomic():
                base = self._base(kb, user, create=create, dry_run=True)
                report = self._index(base, paths, suffixes, recursive, encoding, dry_run=True)
                transaction.set_rollback(True)
        self._summary(report, dry_run)

    def _base(self, ref: str, user: User | None, *, create: bool, dry_run: bool) -> KnowledgeBase:
        base = _find_base(ref, user)
        if base is None:
            if not create:
                raise CommandError(f"Unknown knowledge base {ref!r}.")
            if user is None:
                raise CommandError("--create needs --owner.")
            try:
                base = knowledge_base_create(
                    owner=user, name=ref, source_kind=KnowledgeBase.SourceKind.FILES
                )
            except KnowledgeError as exc:
                raise CommandError(str(exc)) from exc
            verb = "Would create" if dry_run else "Created"
            self.stdout.write(f"{verb} file-backed knowledge base {base.name!r} for {user}.")
        if base.source_kind != KnowledgeBase.SourceKind.FILES:
            raise CommandError(
                f"Knowledge base {base.name!r} is not file-backed (source_kind={base.source_kind})."
            )
        return base

    def _index(
        self,
        base: KnowledgeBase,
        paths: list[Path],
        suffixes: list[str] | None,
        recursive: bool,
        encoding: str,
        *,
        dry_run: bool,
    ) -> IndexReport:
        try:
            return knowledge_base_index_files(
                knowledge_base=base,
                paths=paths,
                suffixes=suffixes,
                recursive=recursive,
                encoding=encoding,
                dry_run=dry_run,
                progress=self._progress,
            )
        except KnowledgeError as exc:
            raise CommandError(str(exc)) from exc

    def _progress(self, event: FileEvent) -> None:
        line = f"[{event.position}/{event.total}] {event.action} {event.path}"
        if event.action == "skipped":
            self.stdout.write(f"{line} ({event.reason})", self.style.WARNING)
            return
        noun = "chunk" if event.chunks == 1 else "chunks"
        detail = f"; {event.reason}" if event.reason else ""
        self.stdout.write(f"{line} ({event.chunks} {noun}{detail})")

    def _summary(self, report: IndexReport, dry_run: bool) -> None:
        line = (
            f"added={report.added} updated={report.updated} unchanged={report.unchanged} "
            f"deleted={report.deleted} skipped={report.skipped} chunks={report.chunks_written}"
        )
        self.stdout.write(f"dry run: {line}" if dry_run else line, self.style.SUCCESS)


def _user(username: str) -> User:
    try:
        return get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist:
        raise CommandError(f"No user named {username!r}.") from None


def _find_base(ref: str, user: User | None) -> KnowledgeBase | None:
    """The base with this id or name; a name shared by several owners needs ``user``."""
    bases = KnowledgeBase.objects.select_related("owner")
    if user is not None:
        bases = bases.filter(owner=user)
    try:
        by_id = bases.filter(pk=uuid.UUID(ref)).first()
    except ValueError:
        by_id = None
    if by_id is not None:
        return by_id
    named = list(bases.filter(name=ref).order_by("owner__username")[:10])
    if len(named) > 1:
        owners = ", ".join(base.owner.get_username() for base in named)
        raise CommandError(
            f"Knowledge base name {ref!r} is ambiguous (owners: {owners}); pass --owner."
        )
    return named[0] if named else None
