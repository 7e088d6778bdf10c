"""The process edge of every worker: the app `celery -A workers` runs, built from the environment."""

from workers.app import make_app
from workers.settings import WorkerSettings

app = make_app(WorkerSettings.from_env())
