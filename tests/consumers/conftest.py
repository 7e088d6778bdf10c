"""The consumer check runs the trainers' own code (`scripts/test --consumers`, docs/export.md).

Nothing here may reach a model hub: set before `huggingface_hub` and `datasets` are imported, these make
any attempt fail at once instead of waiting on the network.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
