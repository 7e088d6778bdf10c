"""The shared run state in Redis and the exactly-once protocol over it.

Owns: every key name (`keys.py`), every Lua script (`protocol.py`), the per-prompt ledger (staged, done,
dead, poison strikes), run settings and pause control, the counters `status` reads, queue and task names
and kombu's Redis layout, and how a message is dispatched. Both sides stand on it: the producer reads
and writes runs through it, the workers stage and settle through it.

Imports only `inference`, `workers.errors` and `workers.periodic`; nothing of the other rooms.
"""
