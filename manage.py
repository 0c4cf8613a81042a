#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
    from django.core.management import execute_from_command_line

    from core.tenancy import for_command

    for_command(sys.argv)  # whose rows the command may touch (core.tenancy)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
