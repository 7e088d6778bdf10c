"""What a dataset needs to say about the server that generated it, read once from its `/server_info`.

SGLang's `/server_info` holds every resolved server argument plus `version`; only the settings that
shape the tokens are kept (the model, its context, the speculative decoding and the reasoning
parser), so the same server always yields the same facts and the same `facts_id`. Rows point at
their server's facts through `Origin.server`; the output keeps each server's facts once, under
`servers/<id>.json`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from core.records import Record

FACTS_ID_HEX_CHARS = 16


class ServerFacts(Record, frozen=True):
    server_url: str
    version: str | None
    model_path: str | None
    served_model_name: str | None
    context_length: int | None
    reasoning_parser: str | None
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    tp_size: int | None
    dp_size: int | None
    dtype: str | None
    kv_cache_dtype: str | None


def _str(info: Mapping[str, Any], name: str) -> str | None:
    value = info.get(name)
    return str(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else None


def _int(info: Mapping[str, Any], name: str) -> int | None:
    value = info.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def facts_from_server_info(info: Mapping[str, Any], server_url: str) -> ServerFacts:
    """The facts of one `/server_info` body; fields the server does not state are None."""
    return ServerFacts(
        server_url=server_url,
        version=_str(info, "version"),
        model_path=_str(info, "model_path"),
        served_model_name=_str(info, "served_model_name"),
        context_length=_int(info, "context_length"),
        reasoning_parser=_str(info, "reasoning_parser"),
        speculative_algorithm=_str(info, "speculative_algorithm"),
        speculative_draft_model_path=_str(info, "speculative_draft_model_path"),
        speculative_num_steps=_int(info, "speculative_num_steps"),
        speculative_eagle_topk=_int(info, "speculative_eagle_topk"),
        speculative_num_draft_tokens=_int(info, "speculative_num_draft_tokens"),
        tp_size=_int(info, "tp_size"),
        dp_size=_int(info, "dp_size"),
        dtype=_str(info, "dtype"),
        kv_cache_dtype=_str(info, "kv_cache_dtype"),
    )


def encode_facts(facts: ServerFacts) -> bytes:
    """Canonical JSON: the same facts always give the same bytes, hence the same id and object."""
    return msgspec.json.encode(facts, order="sorted")


def decode_facts(data: bytes) -> ServerFacts:
    return msgspec.json.decode(data, type=ServerFacts)


def facts_id(facts: ServerFacts) -> str:
    return hashlib.sha256(encode_facts(facts)).hexdigest()[:FACTS_ID_HEX_CHARS]
