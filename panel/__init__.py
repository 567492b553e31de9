# Load the Celery app with Django (as Celery's Django guide does), so that a task sent from any process of the
# panel goes to the configured broker.
from workers.celery import app as celery_app

__all__ = ["celery_app"]
