#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryproject.settings")
    from django.core.management import execute_from_command_line

    from core.tenancy import for_command
    from memoryproject.env import EnvError

    for_command(sys.argv)  # whose rows the command may touch (core.tenancy)
    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:  # a bad setting: one line naming it, not a traceback
        sys.exit(f"configuration error: {exc}")


if __name__ == "__main__":
    main()
