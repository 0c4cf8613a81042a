from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from ingestion.portability import import_lines


class Command(BaseCommand):
    help = (
        "Import an export_memory file into an owner's memory: idempotent (the same file "
        "twice adds nothing), all or nothing (a bad line is named, nothing is written)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("owner", help="Username of the owner to import into.")
        parser.add_argument("file", help="The JSON Lines file.")
        parser.add_argument("--scope-map", action="append", default=[], metavar="OLD=NEW",
                            help='Rename a scope on the way in, e.g. "user/alice=user/ann" '
                                 "(repeatable).")  # fmt: skip

    def handle(self, *args: Any, owner: str, file: str, scope_map: list[str],
               **options: Any) -> None:  # fmt: skip
        user = get_user_model().objects.filter(username=owner).first()
        if user is None:
            raise CommandError(f"No user {owner!r}.")
        mapping = {}
        for item in scope_map:
            old, sep, new = item.partition("=")
            if not sep or not old or not new:
                raise CommandError(f"--scope-map takes OLD=NEW, not {item!r}.")
            mapping[old] = new
        try:
            with Path(file).open(encoding="utf-8") as lines:
                report = import_lines(owner=user, lines=lines, scope_map=mapping)
        except OSError as exc:
            raise CommandError(str(exc)) from exc
        except UnicodeDecodeError as exc:  # (read in the import's transaction: nothing kept)
            raise CommandError(f"{file} is not UTF-8 text: nothing imported") from exc
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(report.as_dict()))
