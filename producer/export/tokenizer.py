"""Counting tokens with the target's own tokenizer (`tokenizer.json`), for rows without token ids."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from producer.errors import SettingsError


def load_token_counter(path: Path) -> Callable[[str], int]:
    """text -> its token count under the tokenizer at `path` (special tokens such as `<|im_end|>` count
    as one, as the server samples them)."""
    try:
        from tokenizers import Tokenizer  # optional: only `export --tokenizer` needs it
    except ImportError as error:
        raise SettingsError(
            "--tokenizer needs the `tokenizers` package: pip install 'draftgen[export]'"
        ) from error
    if not path.is_file():
        raise SettingsError(f"--tokenizer {path}: no such file (give the model's tokenizer.json)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # the library raises its own untyped errors for a malformed file
        raise SettingsError(
            f"--tokenizer {path}: not a tokenizer.json the tokenizers library reads: {error}"
        ) from error

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
