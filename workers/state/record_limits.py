"""How large a record read back from Redis may be: the ceilings every decode of a blob or JSON value keeps.

A ceiling is what a real record can be, not what memory allows, so anything past it is not a record at
all (a decompression bomb, a forged or corrupt value) and is refused before it is inflated.

- One request fills at most the longest context a served model offers (LONGEST_CONTEXT_TOKENS, prompt
  and answer together). A completion holds each of its tokens twice: as text (at most
  MAX_ROW_BYTES_PER_TOKEN bytes of JSON, as intake/limits.py reckons a row) and as an id in a JSON list
  (TOKEN_ID_JSON_BYTES). So one request's record is at most REQUEST_RECORD_BYTES (16 MiB) and a few
  fixed fields.
- A conversation regenerated turn by turn holds its earlier turns too, each with its own ids:
  RECORD_LIMIT_BYTES leaves room for REQUESTS_PER_RECORD such requests. The hand-over refuses a larger
  record (workers/state/ledger.py dead-letters it as `record_too_large`), so no staged record a worker
  made honestly is ever past the ceiling the uploader reads with.
- A batch's body holds its prompts, each at most one context of text: `batch_body_limit_bytes`.
- JSON records (dead letters, strikes, lease holders, server facts, pause notes, run settings, heartbeats)
  are a few KB: SMALL_RECORD_LIMIT_BYTES. A dead letter's error is cut to DEAD_LETTER_ERROR_MAX_CHARS at
  the hand-over so that it always fits.
"""

from __future__ import annotations

from intake.limits import LONGEST_CONTEXT_TOKENS, MAX_ROW_BYTES_PER_TOKEN

TOKEN_ID_JSON_BYTES = 8  # a token id in a JSON list: at most 7 digits (vocabularies stay under 10M) and ","
RECORD_FIXED_FIELDS_BYTES = 64 * 1024  # sampling, usage, timings, origin, labels: well under this
REQUEST_RECORD_BYTES = LONGEST_CONTEXT_TOKENS * (MAX_ROW_BYTES_PER_TOKEN + TOKEN_ID_JSON_BYTES)
REQUESTS_PER_RECORD = 4  # a conversation's last request and its earlier turns
RECORD_LIMIT_BYTES = REQUESTS_PER_RECORD * REQUEST_RECORD_BYTES + RECORD_FIXED_FIELDS_BYTES  # 64 MiB
PROMPT_LIMIT_BYTES = LONGEST_CONTEXT_TOKENS * MAX_ROW_BYTES_PER_TOKEN + RECORD_FIXED_FIELDS_BYTES
SMALL_RECORD_LIMIT_BYTES = 1024 * 1024
DEAD_LETTER_ERROR_MAX_CHARS = 64 * 1024
PREVIEW_BYTES = 256  # of a quarantined record: enough to recognise it, never the record


def batch_body_limit_bytes(batch_size: int) -> int:
    """The most a batch of `batch_size` prompts decodes to."""
    return max(batch_size, 1) * PROMPT_LIMIT_BYTES
