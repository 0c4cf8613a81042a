from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingestion.portability import export_lines


class Command(BaseCommand):
    help = (
        "Export everything an owner keeps (knowledge bases, flows and conversations, memory "
        "bases, memory stores, facts with their history, journals) as JSON Lines "
        "(docs/history-and-export.md), to a file or stdout."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("owner", help="Username of the owner.")
        parser.add_argument("--output", "-o", help="The file to write (default: stdout).")
        parser.add_argument("--no-vectors", action="store_true",
                            help="Leave the vectors out (an import embeds the texts again).")  # fmt: skip

    def handle(self, *args: Any, owner: str, output: str | None, no_vectors: bool,
               **options: Any) -> None:  # fmt: skip
        user = get_user_model().objects.filter(username=owner).first()
        if user is None:
            raise CommandError(f"No user {owner!r}.")
        lines = export_lines(owner=user, vectors=not no_vectors)
        if output is None:
            try:
                for line in lines:
                    sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except BrokenPipeError:  # the reader left (``| head``): no traceback
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(1)
            return
        count = 0
        try:
            with Path(output).open("w", encoding="utf-8") as out:
                for line in lines:
                    out.write(line + "\n")
                    count += 1
        except OSError as exc:  # no such directory, a directory, no space left
            raise CommandError(f"cannot write {output}: {exc.strerror or exc}") from exc
        self.stderr.write(f"Wrote {count} lines to {output}.")
