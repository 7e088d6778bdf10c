"""The process edge of every worker: the app `celery -A workers` runs, built from the environment.

A bad `DRAFTGEN_*` variable ends the process with one line naming it, not a traceback."""

import sys

from workers.app import make_app
from workers.errors import Refused
from workers.settings import WorkerSettings

try:
    app = make_app(WorkerSettings.from_env())
except Refused as error:
    sys.exit(f"error: {error}")
