"""The consumer check runs the trainers' own code (`scripts/test --consumers`, docs/export.md).

Nothing here may reach a model hub: set before `huggingface_hub` and `datasets` are imported, these make
any attempt fail at once instead of waiting on the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.run_output import IM_END, IM_START, NEWLINE, THINK_CLOSE, THINK_OPEN, WORD_ID

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def target_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local tokenizer folder (`--model`) knowing the test rows' ids: no hub, no model."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {
        "<unk>": 0,
        "\n": NEWLINE,
        "word": WORD_ID,
        "<|im_start|>": IM_START,
        "<|im_end|>": IM_END,
        "<think>": THINK_OPEN,
        "</think>": THINK_CLOSE,
    }
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
