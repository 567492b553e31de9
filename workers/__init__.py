# The Celery app is loaded with the package so that tasks sent from the web process use its broker settings.
from workers.celery import app as celery_app

__all__ = ["celery_app"]
