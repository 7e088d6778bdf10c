"""The floor every package stands on: the records the parts exchange, a run's settings, exit codes, and the
plumbing each needs alike (S3 clients, backoff, safe paths, listening addresses, private files).

It imports no other package of draftgen, and no Celery or Redis.
"""
