"""Celery tasks of panel.dashboards: thin wrappers over its service functions (on beat, queue default)."""
from celery import shared_task


@shared_task(name="panel.dashboards.tasks.scrape_engines", soft_time_limit=60, time_limit=90, ignore_result=True)
def scrape_engines():
    from panel.dashboards.scraper import deployments_scrape

    return len(deployments_scrape())


@shared_task(name="panel.dashboards.tasks.roll_up_usage", soft_time_limit=300, time_limit=360, ignore_result=True)
def roll_up_usage():
    from panel.dashboards.rollup import usage_rollup_run

    return usage_rollup_run()
