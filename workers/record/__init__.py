"""The output record: the object stores (a folder, S3), the manifest and its parts, the Parquet and JSONL
codecs, the output pin, and the uploader that batches staged completions into committed parts.

"A part was committed twice" starts here (`manifest.py`, `uploader.py`). Imports `workers.state` for the
staged completions and the upload lock; nothing of generation, recovery or the Celery edge.
"""
