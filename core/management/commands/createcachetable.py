"""Django's ``createcachetable``, connected as the tables' owner (core.management.table_owner)."""

from django.core.management.commands.createcachetable import Command as DjangoCommand

from core.management.table_owner import as_table_owner

Command = as_table_owner(DjangoCommand, secure=True)
