"""What a run reads: its prompts (JSONL, Parquet, Arrow and `datasets` folders, local or on S3, as a stream
of prompts and rejected rows) and its settings file with the options stated over it.

`enqueue` reads them through here, and so does `python -m node preflight` (its `--prompts` and
`--config`): one reading for both, so a verdict on a run's files is a verdict on what the run will send.

Imports only the core of `inference` (records, sampling options, S3, backoff); nothing of the node tools,
the workers or the producer.
"""
