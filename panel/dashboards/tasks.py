"""Celery tasks of panel.dashboards: thin wrappers over its service functions (on beat, queue default; a provider
statement's import, queued by its upload)."""
from celery import shared_task

from panel.dashboards.compaction import engine_samples_compact
from panel.dashboards.ledger import ledgers_check
from panel.dashboards.local_cost import local_cost_allocate
from panel.dashboards.rollup import HARD_TIME_LIMIT_SECONDS, SOFT_TIME_LIMIT_SECONDS, usage_rollup_run
from panel.dashboards.scraper import deployments_scrape, engine_readings, pools_scrape
from panel.dashboards.statements import statement_import_run
from panel.serving.scaling import deployments_scale


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def scrape_engines():
    scraped = len(deployments_scrape()) + len(pools_scrape())
    deployments_scale(readings=engine_readings)  # scale on queue decides on what was just scraped
    engine_samples_compact()  # an indexed look-up that finds nothing most of the time
    return scraped


@shared_task(soft_time_limit=SOFT_TIME_LIMIT_SECONDS, time_limit=HARD_TIME_LIMIT_SECONDS, ignore_result=True)
def roll_up_usage():
    return usage_rollup_run()


# The roll-up's limits: the run holds the roll-up's lock, which lasts as long as the hard limit.
@shared_task(soft_time_limit=SOFT_TIME_LIMIT_SECONDS, time_limit=HARD_TIME_LIMIT_SECONDS, ignore_result=True)
def allocate_local_cost():
    return local_cost_allocate().minutes


@shared_task(soft_time_limit=120, time_limit=150, ignore_result=True)
def check_ledgers():
    return len(ledgers_check())


@shared_task(bind=True, soft_time_limit=120, time_limit=150, ignore_result=True)
def import_statement(self, import_id):
    statement = statement_import_run(import_id, self.request.hostname or "unknown")
    return statement.pk if statement else None
