"""The Celery side: `celery -A workers worker -Q generate` (one per GPU) and `-Q upload` (the uploader).

`celery -A workers` finds the app in `workers/celery.py`, the process edge that builds it from the
`DRAFTGEN_*` environment. Importing the package or any module of it builds no app.
"""
