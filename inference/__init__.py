"""Everything that talks to (or stands in for) an SGLang server.

The lowest layer: no Celery and no Redis imports here. `records` holds the msgspec records
that every other package imports.
"""
