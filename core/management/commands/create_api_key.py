from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.audit import Actor, acting_as
from core.errors import InvalidInput
from core.models import APIKey
from core.services import api_key_create

LIMIT_OPTIONS = {
    "--knowledge-base": "knowledge_bases",
    "--memory-base": "memory_bases",
    "--flow": "flows",
    "--memory-store": "memory_stores",
}


class Command(BaseCommand):
    help = (
        "Create an API key for a user. The key is printed alone on the last line. "
        "--create-user creates the user first (without a password: an API-only account)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="Owner of the key.")
        parser.add_argument("--name", default="", help="A label for the key.")
        parser.add_argument(
            "--read-only",
            action="store_true",
            help="The key reads and searches, and changes nothing.",
        )
        parser.add_argument("--expires-at", default=None, metavar="ISO-8601",
                            help="When the key stops working, e.g. 2027-01-31T00:00:00Z.")  # fmt: skip
        for option, kind in LIMIT_OPTIONS.items():
            parser.add_argument(
                option, action="append", default=None, dest=kind, metavar="ID",
                help=f"Limit the key to this {kind.replace('_', ' ')[:-1]} (repeat for more).",
            )  # fmt: skip
        parser.add_argument(
            "--scope", default=None, metavar="JSON",
            help='Limit the key to a memory scope, a JSON list: \'["user", "alice"]\' (one '
            "end user: also the users/{id} routes and the chat proxy's user header).",
        )  # fmt: skip
        parser.add_argument("--tool", action="append", default=None, dest="tools",
                            metavar="NAME", help="Limit the key to this tool (repeat for more).")  # fmt: skip
        parser.add_argument(
            "--create-user",
            action="store_true",
            help="Create the user when there is none of that name (no password, not staff).",
        )

    def handle(
        self, *args: Any, username: str, name: str, create_user: bool, read_only: bool,
        expires_at: str | None, scope: str | None, **options: Any,
    ) -> None:  # fmt: skip
        limits = {k: options[k] for k in (*LIMIT_OPTIONS.values(), "tools") if options.get(k)}
        if scope is not None:
            try:
                limits["scope"] = json.loads(scope)
            except ValueError:
                raise CommandError(f'--scope must be a JSON list such as \'["user", "alice"]\', '
                                   f"not {scope!r}") from None  # fmt: skip
        try:  # (2030-02-30 or an offset of +25:00 was a ValueError's traceback)
            expiry = parse_datetime(expires_at) if expires_at else None
        except ValueError as exc:
            raise CommandError(f"--expires-at {expires_at!r} is no time: {exc}") from None
        longest = APIKey._meta.get_field("name").max_length or 0
        if len(name) > longest:  # (the column's length: it was a DataError's traceback)
            raise CommandError(f"--name is at most {longest} characters")
        if expires_at and (expiry is None or expiry.tzinfo is None):
            raise CommandError(
                f"--expires-at must be an ISO 8601 time with its zone, not {expires_at!r}"
            )
        if expiry is not None and expiry <= timezone.now():
            raise CommandError("--expires-at must be in the future")
        users = get_user_model().objects
        with transaction.atomic():
            owner = users.filter(username=username).first()
            if owner is None and not create_user:
                raise CommandError(
                    f"No user named {username!r}. Add --create-user to create it, or create "
                    "one with `manage.py createsuperuser` (or in the admin: Users → Add)."
                )
            if owner is None:
                try:  # (Django's own rules for a username: "" or "bad user/name" passed)
                    users.model.username_validator(username)
                    longest = users.model._meta.get_field("username").max_length or 0
                    if not 0 < len(username) <= longest:
                        raise ValidationError(f"1 to {longest} characters")
                except ValidationError as exc:
                    raise CommandError(f"{username!r} is no username: {exc.messages[0]}") from None
                owner = users.create_user(username=username)  # an unusable password
                self.stdout.write(f"Created user {username} (API access only, no password).")
            with acting_as(Actor("command")):
                try:
                    api_key, raw_key = api_key_create(
                        owner=owner, name=name, read_only=read_only, expires_at=expiry,
                        limits=limits,
                    )  # fmt: skip
                except InvalidInput as exc:
                    raise CommandError(_as_options(str(exc))) from None
        self.stdout.write(f"Created API key {api_key.prefix}… for {username}. Store it now:")
        self.stdout.write(raw_key)


def _as_options(message: str) -> str:
    """A service's message naming the limits as the command's options name them
    (``limits.knowledge_bases`` is ``--knowledge-base``)."""
    names = {kind: option for option, kind in LIMIT_OPTIONS.items()}
    names |= {"tools": "--tool", "scope": "--scope"}
    for kind, option in names.items():
        message = message.replace(f"limits.{kind}", option)
    return message.replace("limits.", "--")
