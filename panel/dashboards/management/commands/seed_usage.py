import time

from django.core.management.base import BaseCommand, CommandError

from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.seed import usage_seed, usage_seed_sql


class Command(BaseCommand):
    help = ("Write N synthetic usage records (default 1,000,000) over the last 30 days for one team, then roll them "
            "up for the dashboards.")

    def add_arguments(self, parser):
        parser.add_argument("count", nargs="?", type=int, default=1_000_000)
        parser.add_argument("--team", help="the team's name (default: the first team)")
        parser.add_argument("--seed", type=int, default=1, help="random seed (the same seed writes the same data)")
        parser.add_argument("--no-rollup", action="store_true", help="only write the records")
        parser.add_argument("--sql", action="store_true", help="generate the records inside the database: much "
                            "faster for millions, uniform distributions")

    def handle(self, *args, count, team, seed, no_rollup, sql, **options):
        from panel.accounts.models import Team

        if count < 1:
            raise CommandError("N must be at least 1")
        teams = Team.objects.order_by("pk")
        chosen = teams.filter(name=team).first() if team else teams.first()
        if chosen is None:
            raise CommandError(f"no team named {team!r}" if team
                               else "no team yet: sign in once (make run creates one)")
        step = max(count // 10, 5000)

        def progress(done):
            if done % step < 5000 or done == count:
                self.stdout.write(f"  {done:,} records")

        if sql:
            seconds = usage_seed_sql(team=chosen, count=count, on_progress=progress)
        else:
            seconds = usage_seed(team=chosen, count=count, seed=seed, on_progress=progress)
        self.stdout.write(f"wrote {count:,} usage records for {chosen.name} in {seconds:.1f} s "
                          f"({count / seconds:,.0f}/s)")
        if not no_rollup:
            began = time.monotonic()
            read = usage_rollup_run(lock=False)
            took = time.monotonic() - began
            self.stdout.write(f"rolled up {read:,} records in {took:.1f} s ({read / max(took, 1e-9):,.0f}/s)")
