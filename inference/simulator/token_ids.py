"""The token ids the simulator reports (`prompt_token_ids`, `response_token_ids`, `sglext.input_ids`
and `sglext.output_ids`): Qwen3's special ids, and one stable id per word.

Prompt: the simulator's chat template, token for token as `count_prompt_tokens` counts it, so that
`len(prompt ids) == usage.prompt_tokens`:
- per message `<|im_start|>` role `"\\n"` <one id per whitespace word of the content> `<|im_end|>`
  (Qwen writes a `"\\n"` after `<|im_end|>`; the simulator does not count it, so neither does it here);
- then the generation prompt `<|im_start|>` `assistant` `"\\n"` `<think>` `"\\n"` with thinking on, or
  `<|im_start|>` `assistant` `"\\n"` `<think>` `</think>` with thinking off (Qwen's blank lines around
  that empty think block are left out for the same reason).
The roles system, user and assistant have Qwen's ids; every other word (a role or a content word)
hashes to a stable id in the regular vocabulary (below 151643, where Qwen's special tokens start).

Response: `GenerationPlan.pieces` are one token each and map one for one, thinking included and before
the reasoning parser splits the text: a filler word (whatever spaces or newlines surround it in its
piece) to its fixed id in `FILLER_TOKEN_IDS`, `</think>` to 151668, the empty EOS piece to `<|im_end|>`
151645. So `len(response ids) == usage.completion_tokens`; an answer cut by the budget has no EOS; a stop
string trims the text of the token that completed it, not the token, which keeps its id.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from inference.simulator.thinking import (
    EOS_TOKEN_ID,
    FILLER_WORDS,
    THINK_END,
    GenerationPlan,
    content_words,
)

IM_START_TOKEN_ID = 151644
IM_END_TOKEN_ID = EOS_TOKEN_ID  # 151645, Qwen3's EOS
THINK_START_TOKEN_ID = 151667
THINK_END_TOKEN_ID = 151668
NEWLINE_TOKEN_ID = 198
REGULAR_VOCAB_SIZE = 151643  # ids 0..151642 are ordinary tokens; 151643 is <|endoftext|>
ROLE_TOKEN_IDS = {"system": 8948, "user": 872, "assistant": 77091}
WORD_HASH_BYTES = 8
WORD_ID_CACHE_SIZE = 1 << 16  # words whose id is kept: a prompt's ids are computed for the prefix cache


@functools.lru_cache(maxsize=WORD_ID_CACHE_SIZE)
def word_token_id(word: str) -> int:
    """A stable id in the regular vocabulary for `word`, the same in every process and run."""
    digest = hashlib.blake2b(word.encode(), digest_size=WORD_HASH_BYTES).digest()
    return int.from_bytes(digest, "big") % REGULAR_VOCAB_SIZE


FILLER_TOKEN_IDS = {word: word_token_id(word) for word in FILLER_WORDS}


def _role_token_id(role: Any) -> int:
    name = str(role)
    return ROLE_TOKEN_IDS[name] if name in ROLE_TOKEN_IDS else word_token_id(name)


def prompt_token_ids(messages: Sequence[Mapping[str, Any]], thinking: bool) -> list[int]:
    """The prompt as the server tokenized it: the chat template applied to `messages`."""
    ids: list[int] = []
    for message in messages:
        ids += [IM_START_TOKEN_ID, _role_token_id(message.get("role")), NEWLINE_TOKEN_ID]
        ids += [word_token_id(word) for word in content_words(message.get("content"))]
        ids.append(IM_END_TOKEN_ID)
    ids += [IM_START_TOKEN_ID, ROLE_TOKEN_IDS["assistant"], NEWLINE_TOKEN_ID, THINK_START_TOKEN_ID]
    ids.append(NEWLINE_TOKEN_ID if thinking else THINK_END_TOKEN_ID)
    return ids


def _piece_token_id(piece: str) -> int:
    if piece == "":
        return IM_END_TOKEN_ID
    if piece == THINK_END:
        return THINK_END_TOKEN_ID
    word = piece.strip()
    return FILLER_TOKEN_IDS[word] if word in FILLER_TOKEN_IDS else word_token_id(word)


def response_token_ids(plan: GenerationPlan, produced: int) -> list[int]:
    """Every sampled id of the first `produced` output tokens."""
    pieces = list(plan.pieces[:produced])
    if plan.stop_token_piece is not None and produced == len(plan.pieces):
        pieces[-1] = plan.stop_token_piece
    return [_piece_token_id(piece) for piece in pieces]
