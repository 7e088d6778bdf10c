"""Flower's settings for draftgen. Flower reads ./flowerconfig.py when started as `celery -A workers flower`
from the project folder (the Procfile, the systemd unit and the demo all do).

The login guard is not here: it lives in workers/flower_guard.py, which the app installs itself, so it
holds from any folder and with any --conf. Flower listens on 127.0.0.1 unless given an address; beyond
loopback it asks for a login: FLOWER_BASIC_AUTH=user:password (or --basic-auth=..., or OAuth with
--auth=...), and an entry with an empty user or password stops it.
"""

# Bounded memory on long runs (Flower keeps tasks in memory), and offline workers leave the view.
max_tasks = 10000
purge_offline_workers = 3600
