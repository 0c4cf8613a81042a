from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a user. The key is printed alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="Owner of the key.")
        parser.add_argument("--name", default="", help="A label for the key.")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        try:
            owner = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        api_key, raw_key = api_key_create(owner=owner, name=name)
        self.stdout.write(f"Created API key {api_key.prefix}… for {username}. Store it now:")
        self.stdout.write(raw_key)
