"""Counting tokens with the target's own tokenizer (`tokenizer.json`), for rows without token ids."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core.bounded_files import read_bounded
from core.errors import SettingsRefused
from producer.errors import SettingsError

TOKENIZER_FILE_LIMIT_BYTES = 256 << 20  # a large vocabulary's tokenizer.json is tens of MB


def load_token_counter(path: Path) -> Callable[[str], int]:
    """text -> its token count under the tokenizer at `path` (special tokens such as `<|im_end|>` count
    as one, as the server samples them)."""
    try:
        from tokenizers import Tokenizer  # optional: only `export --tokenizer` needs it
    except ImportError as error:
        raise SettingsError(
            "--tokenizer needs the `tokenizers` package: pip install 'draftgen[export]'"
        ) from error
    try:
        text = read_bounded(path, limit_bytes=TOKENIZER_FILE_LIMIT_BYTES, what="a tokenizer.json").decode()
    except SettingsRefused as error:
        raise SettingsError(f"--tokenizer: {error} (give the model's tokenizer.json)") from error
    except UnicodeDecodeError as error:
        raise SettingsError(f"--tokenizer {path}: not a tokenizer.json (not UTF-8 text)") from error
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as error:  # the library raises its own untyped errors for a malformed file
        raise SettingsError(
            f"--tokenizer {path}: not a tokenizer.json the tokenizers library reads: {error}"
        ) from error

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
