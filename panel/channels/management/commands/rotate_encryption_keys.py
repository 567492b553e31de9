"""`manage.py rotate_encryption_keys`: re-encrypt every stored upstream key under the first key of
TOKENWISE_ENCRYPTION_KEYS (put the new key first, keep the old ones after it until this has run)."""
from django.core.management.base import BaseCommand, CommandError

from panel.channels.services import credentials_rotate


class Command(BaseCommand):
    help = "Re-encrypt every stored channel credential under the first TOKENWISE_ENCRYPTION_KEYS key."

    def handle(self, *args, **options):
        rotated, problems = credentials_rotate()
        for problem in problems:
            self.stderr.write(f"cannot decrypt, channel marked misconfigured: {problem}")
        self.stdout.write(f"re-encrypted {rotated} credential(s)")
        if problems:
            raise CommandError(f"{len(problems)} credential(s) could not be decrypted with any configured key")
