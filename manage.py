#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "panel.settings")
    from panel.env import EnvError

    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    except EnvError as error:
        sys.exit(f"tokenwise: configuration error: {error}")


if __name__ == "__main__":
    main()
