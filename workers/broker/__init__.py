"""How draftgen's messages travel: the broker connection and its routes (`broker.py`), kombu's Redis
transport made to ride out a Redis restart and to work without Lua for a consumer's user, the check of
every queue item's raw bytes before kombu reads it, where a malformed one is parked, and kombu's Redis
layout as draftgen reads it. Below it: the run state (`workers/state/`), for queue names and keys.
"""
