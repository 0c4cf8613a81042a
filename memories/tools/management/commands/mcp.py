"""``manage.py mcp --owner NAME [--scope SEGMENT ...]``: the MCP server over stdio, for
desktop clients (Claude Desktop, Cursor...). stdout carries the protocol: nothing else
may write to it."""

from __future__ import annotations

import logging
import sys
from typing import Any

import anyio
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from memories.facts.scopes import scope_parse
from memories.tools.mcp_server import build_server, current_owner, served_scope
from memories.tools.mcp_stdio import serve_stdio


class Command(BaseCommand):
    help = (
        "Serve the memory tools and resources over MCP on stdin/stdout for one owner; "
        "with --scope, for that one scope only (e.g. --scope user alice)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--owner", required=True, help="the username whose memories to serve")
        parser.add_argument(
            "--scope", nargs="+", default=None, help="the scope's segments, e.g. user alice"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
        owner = get_user_model().objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(f"no user {options['owner']!r}")
        if options["scope"]:
            try:
                served_scope.set(scope_parse(options["scope"], field="--scope"))
            except ServiceError as exc:
                raise CommandError(str(exc)) from None
        current_owner.set(owner.pk)  # before the loop starts: every task inherits it
        anyio.run(serve_stdio, build_server())  # (every request answered: mcp_stdio)
