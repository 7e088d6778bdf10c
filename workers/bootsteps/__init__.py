"""What a worker process starts beside Celery's consumer: the seat taken at `worker_init`, the heartbeat,
the server liveness watch, the reconciler and the consumer watch, each a bootstep built from the
worker's settings. The Celery edge: imports any room, and none of the rooms imports it.
"""
