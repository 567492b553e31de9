#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "panel.settings")
    from panel.env import EnvError
    from panel.launcher import prepare_environment

    try:
        # What `make run` uses: the secrets it generated into data/secrets/ and its Redis on 127.0.0.1:6389, unless
        # SECRET_KEY, TOKENWISE_ENCRYPTION_KEYS or REDIS_URL are set.
        prepare_environment()
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    except EnvError as error:
        sys.exit(f"tokenwise: configuration error: {error}")


if __name__ == "__main__":
    main()
