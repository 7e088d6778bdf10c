"""Everything that talks to (or stands in for) an SGLang server: the client, its stream, the simulator,
and the GPU node's tools (node/).

No Celery and no Redis imports here; the records it sends and reads are core's.
"""
