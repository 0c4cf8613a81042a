from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from memories.stores.api.parsers import yaml_load
from memories.stores.config import memory_config_apply
from memories.stores.services import ConfigInvalid


class Command(BaseCommand):
    help = (
        "Apply a memory configuration (YAML or JSON: memory stores and node attachments) "
        "for one owner, all or nothing. Prints every change; --dry-run writes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="The configuration file (.yaml or .json).")
        parser.add_argument("--owner", help="Username (needed unless there is one user).")
        parser.add_argument(
            "--dry-run", action="store_true", help="Show what would change; write nothing."
        )

    def _owner(self, username: str | None) -> User:
        users = get_user_model().objects
        if username:
            try:
                return users.get(username=username)
            except users.model.DoesNotExist:
                raise CommandError(f"no user {username!r}") from None
        if users.count() != 1:
            raise CommandError("--owner is needed: there is not exactly one user")
        return users.get()

    def handle(self, *args: Any, file: Path, owner: str | None, dry_run: bool, **opts: Any) -> None:
        try:
            document = yaml_load(file.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {file}: {exc}") from exc
        user = self._owner(owner)
        try:
            result = memory_config_apply(owner=user, document=document, dry_run=dry_run)
        except ConfigInvalid as exc:
            lines = [f"  {place}: {m}" for place, msgs in exc.details.items() for m in msgs]
            raise CommandError(
                "the configuration is invalid, nothing was written:\n" + "\n".join(lines)
            ) from exc
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        for change in result.changes:
            where = f" on {change.flow}/{change.node}" if change.kind == "attachment" else ""
            self.stdout.write(f"{change.action:9} {change.kind} {change.store}{where}")
        for name, report in result.loads.items():
            if "error" in report:  # applied all the same: said, and on stderr
                self.stderr.write(f"not loaded {name}: {report['error']['message']}")
            else:
                self.stdout.write(f"loaded    {name}: {report}")
        verb = "would change" if dry_run else "changed"
        counted = sum(1 for c in result.changes if c.action != "unchanged")
        self.stdout.write(f"{counted} {verb}, {len(result.changes) - counted} unchanged")
