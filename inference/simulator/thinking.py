"""The thinking model: what a request generates, as a pure function of (seed, messages, budget).

Tokens are filler words. Every output token renders as one piece of text:
- thinking words (`"w"`, then `" w"`; the last one before `</think>` carries a trailing `"\\n"`),
- the `</think>` token,
- answer words (the first one after `</think>` starts with `"\\n\\n"`, the others with `" "`),
- the EOS token `<|im_end|>` (id 151645), which renders as nothing.
So `len(text.split())` counts the words; `completion_tokens` = words + 1 per `</think>` + 1 per EOS.
Their ids, and the prompt's, are in `token_ids.py`.

The chat template opens `<think>\\n` in the prompt when thinking is on (as Qwen3.5/3.6 templates do), so
the output never starts with `<think>`. SGLang's qwen3 parser then gives reasoning `"w ... w\\n"` and
content `"\\n\\nw ... w"`, nothing stripped, and counts `</think>` in `reasoning_tokens`.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from inference.simulator.length_mix import REASONING, REASONING_MIX, Lognormal
from inference.simulator.settings import SimulatorSettings

EOS_TOKEN_ID = 151645
THINK_END = "</think>"
MESSAGE_OVERHEAD_TOKENS = 4  # <|im_start|>, role, "\n" ... <|im_end|>
GENERATION_PROMPT_TOKENS = 5  # <|im_start|>, assistant, "\n", <think>, "\n"
MESSAGES_HASH_HEX_CHARS = 16
FILLER_WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "cedar",
    "ember",
    "frost",
    "grove",
    "harbor",
    "island",
    "jungle",
    "lantern",
    "meadow",
    "nectar",
    "orchard",
    "pebble",
    "quartz",
    "ridge",
    "summit",
    "tundra",
    "valley",
    "willow",
    "yonder",
    "zenith",
    "amber",
    "bramble",
    "canyon",
    "dune",
    "fjord",
    "glacier",
    "hollow",
    "inlet",
    "juniper",
    "knoll",
    "lagoon",
    "marsh",
    "oasis",
    "prairie",
    "quarry",
    "reef",
    "savanna",
    "thicket",
    "upland",
    "vista",
    "wetland",
    "basin",
    "cove",
    "spring",
    "estuary",
)  # 61 words: a prime count, so any stride in 1..60 visits every word


class PredictedOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the simulator will answer for a request (the same code renders the real response)."""

    prompt_tokens: int
    max_new_tokens: int  # the effective budget
    thinking_on: bool
    thinking_tokens: int  # drawn thinking length, `</think>` included (0 when thinking is off)
    answer_tokens: int  # drawn answer length, EOS included
    completion_tokens: int
    reasoning_tokens: int
    finish_reason: str  # "stop" or "length"
    matched_stop: int | str | None
    reasoning_content: str | None
    content: str
    content_empty: bool
    stopped_inside_thinking: bool
    think_nothing: bool
    context_error: str | None  # the 400 message the server gives instead, if any


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationPlan:
    """Every output token of one request, already cut by the budget or a stop string."""

    pieces: tuple[str, ...]
    thinking_on: bool
    parsed: bool  # the reasoning parser splits the text (reasoning parser on and separate_reasoning)
    counts_reasoning: bool  # usage.reasoning_tokens is counted (a reasoning parser is configured)
    think_end_index: int | None  # index of the `</think>` piece, if emitted
    finish_reason: str
    matched_stop: int | str | None
    thinking_tokens: int
    answer_tokens: int
    stopped_inside_thinking: bool
    think_nothing: bool
    stop_token_piece: str | None = None  # the last piece's text before a stop string trimmed it

    def reasoning_tokens(self, produced: int) -> int:
        if not (self.thinking_on and self.counts_reasoning):
            return 0
        if self.think_end_index is None or produced <= self.think_end_index:
            return produced
        return self.think_end_index + 1

    def split(self, start: int, end: int) -> tuple[str, str]:
        """(reasoning text, content text) of pieces [start, end), as the parser separates them."""
        if not self.parsed:
            return "", "".join(self.pieces[start:end])
        if not self.thinking_on:
            return "", "".join(self.pieces[start:end])
        cut = self.think_end_index if self.think_end_index is not None else len(self.pieces)
        reasoning = "".join(self.pieces[start : min(end, cut)])
        content = "".join(self.pieces[max(start, cut + 1) : end])
        return reasoning, content


def content_words(content: Any) -> list[str]:
    """The whitespace-separated words of a message content (a string or a list of text parts)."""
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):
        return [
            word
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            for word in part["text"].split()
        ]
    return []


def count_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens: one per whitespace-separated word of every content, plus the template's tokens."""
    return GENERATION_PROMPT_TOKENS + sum(
        MESSAGE_OVERHEAD_TOKENS + len(content_words(message.get("content"))) for message in messages
    )


def messages_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """A stable hash of the messages (canonical JSON, sorted keys)."""
    canonical = msgspec.json.encode(list(messages), order="sorted")
    return hashlib.sha256(canonical).hexdigest()[:MESSAGES_HASH_HEX_CHARS]


def context_error(settings: SimulatorSettings, prompt_tokens: int, max_new_tokens: int | None) -> str | None:
    """SGLang's context-length check, with the speculative reserved tokens added to the input."""
    input_tokens = prompt_tokens + settings.num_reserved_tokens
    limit = settings.context_length
    if input_tokens >= limit:
        return (
            f"The input ({input_tokens} tokens) is longer than the model's context length ({limit} tokens)."
        )
    if max_new_tokens is not None and input_tokens + max_new_tokens > limit:
        return (
            f"Requested token count exceeds the model's maximum context length of {limit} tokens. "
            f"You requested a total of {input_tokens + max_new_tokens} tokens: {input_tokens} tokens "
            f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce "
            "the number of tokens in the input messages or the completion to fit within the limit."
        )
    return None


def effective_budget(settings: SimulatorSettings, prompt_tokens: int, max_new_tokens: int | None) -> int:
    """The budget the scheduler applies: the request's, or whatever the context leaves."""
    if max_new_tokens is not None:
        return max_new_tokens
    return max(0, settings.context_length - prompt_tokens - 1)


def thinking_enabled(settings: SimulatorSettings, enable_thinking: bool) -> bool:
    if settings.reasoning_parser == "qwen3-thinking":
        return True
    return enable_thinking


def _lognormal_tokens(rng: random.Random, distribution: Lognormal) -> int:
    return max(1, round(rng.lognormvariate(distribution.mu, distribution.sigma)))


def _drawn_lengths(settings: SimulatorSettings, rng: random.Random) -> tuple[int, int]:
    """(thinking, answer) lengths from the settings' length mix; `single` draws exactly two numbers."""
    if settings.length_mix == REASONING:
        pick, reached = rng.random(), 0.0
        component = REASONING_MIX[-1]
        for candidate in REASONING_MIX:
            reached += candidate.share
            if pick < reached:
                component = candidate
                break
        return _lognormal_tokens(rng, component.thinking), _lognormal_tokens(rng, component.answer)
    thinking = Lognormal.with_mean(settings.thinking_tokens_mean, settings.thinking_tokens_sigma)
    answer = Lognormal.with_mean(settings.answer_tokens_mean, settings.answer_tokens_sigma)
    return _lognormal_tokens(rng, thinking), _lognormal_tokens(rng, answer)


def _rng(settings: SimulatorSettings, messages: Sequence[Mapping[str, Any]]) -> random.Random:
    canonical = msgspec.json.encode(list(messages), order="sorted")
    digest = hashlib.blake2b(f"{settings.seed}:".encode() + canonical, digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


class _Filler:
    """The request's word sequence: word i is FILLER_WORDS[(offset + i * stride) mod 61], so it
    repeats every 61 words and long runs are built by list repetition."""

    def __init__(self, rng: random.Random) -> None:
        self._offset = rng.randrange(len(FILLER_WORDS))
        self._stride = rng.randrange(1, len(FILLER_WORDS))

    def run(self, start: int, count: int) -> list[str]:
        """Pieces `" word"` for words start .. start + count - 1."""
        size = len(FILLER_WORDS)
        period = [
            " " + FILLER_WORDS[(self._offset + (start + i) * self._stride) % size]
            for i in range(min(count, size))
        ]
        return period if count <= size else (period * (count // size + 1))[:count]


def _render(
    filler: _Filler, thinking_words: int | None, closes: bool, answer_words: int | None, budget: int
) -> tuple[list[str], bool]:
    """The first `budget` output pieces, and whether the model would have produced more.

    `thinking_words` None: thinking is off. `answer_words` None: no EOS (ignore_eos)."""
    pieces: list[str] = []
    index = 0
    if thinking_words is not None:
        pieces = filler.run(0, min(thinking_words, budget + 1))
        if pieces:
            pieces[0] = pieces[0][1:]
        if len(pieces) == thinking_words:  # thinking complete within the budget (+1)
            if not closes:
                pieces.append("")  # EOS inside thinking
                return pieces[:budget], len(pieces) > budget
            if pieces:
                pieces[-1] += "\n"
            pieces.append(THINK_END)
        index = thinking_words
    if len(pieces) <= budget:
        room = budget + 1 - len(pieces)
        count = room if answer_words is None else min(answer_words, room)
        answer = filler.run(index, count)
        if answer:
            answer[0] = ("" if thinking_words is None else "\n\n") + answer[0][1:]
        pieces.extend(answer)
        if answer_words is not None and count == answer_words:
            pieces.append("")  # EOS
    return pieces[:budget], len(pieces) > budget


def _first_stop(pieces: list[str], stops: Sequence[str]) -> tuple[int, int, str] | None:
    """(start, end, stop) of the earliest stop-string match in the rendered text."""
    text = "".join(pieces)
    matches = [
        (position, position + len(stop), stop)
        for stop in stops
        if stop
        for position in [text.find(stop)]
        if position >= 0
    ]
    return min(matches) if matches else None


def _cut_at_stop(pieces: list[str], match: tuple[int, int, str], no_stop_trim: bool) -> list[str]:
    """Keep the tokens up to the one completing the match; trim the stop text unless no_stop_trim."""
    start, end, _ = match
    ends = list(itertools.accumulate(len(piece) for piece in pieces))
    last = bisect.bisect_left(ends, end)
    keep = end if no_stop_trim else start
    pieces = pieces[: last + 1]
    pieces[last] = pieces[last][: len(pieces[last]) - (ends[last] - keep)]
    return pieces


def plan_generation(
    settings: SimulatorSettings,
    messages: Sequence[Mapping[str, Any]],
    max_new_tokens: int | None,
    enable_thinking: bool = True,
    *,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    min_tokens: int = 0,
    separate_reasoning: bool = True,
    no_stop_trim: bool = False,
) -> GenerationPlan:
    """Draw the request's lengths from (seed, messages) and cut the output by budget and stop strings.

    Only the tokens within the budget are rendered, so a small budget costs little."""
    rng = _rng(settings, messages)
    thinking_on = thinking_enabled(settings, enable_thinking)
    thinking_drawn, answer_drawn = _drawn_lengths(settings, rng)
    stops_in_thinking = rng.random() < settings.stop_in_thinking_rate
    think_nothing = rng.random() < settings.think_nothing_rate and not stops_in_thinking
    filler = _Filler(rng)
    budget = effective_budget(settings, count_prompt_tokens(messages), max_new_tokens)
    thinking_words = 0 if think_nothing else thinking_drawn - 1  # one token is `</think>` (or EOS)
    answer_words = answer_drawn - 1
    thinking_part = thinking_words + 1 if thinking_on else 0
    if ignore_eos or thinking_part + (0 if thinking_on and stops_in_thinking else answer_drawn) < min_tokens:
        stops_in_thinking = False
        answer_words = max(answer_words, min_tokens - thinking_part - 1)
    pieces, cut_by_budget = _render(
        filler,
        thinking_words if thinking_on else None,
        not stops_in_thinking,
        None if ignore_eos else answer_words,
        budget,
    )
    finish_reason = "stop"
    matched_stop: int | str | None = EOS_TOKEN_ID
    stop_match = _first_stop(pieces, stop)
    stop_token_piece = None
    if stop_match is not None:
        cut = _cut_at_stop(pieces, stop_match, no_stop_trim)
        stop_token_piece, pieces = pieces[len(cut) - 1], cut
        matched_stop = stop_match[2]
    elif cut_by_budget:
        finish_reason, matched_stop = "length", None
    think_end = pieces.index(THINK_END) if thinking_on and THINK_END in pieces else None
    return GenerationPlan(
        pieces=tuple(pieces),
        thinking_on=thinking_on,
        parsed=separate_reasoning and settings.reasoning_parser != "none",
        counts_reasoning=settings.reasoning_parser != "none",
        think_end_index=think_end,
        finish_reason=finish_reason,
        matched_stop=matched_stop,
        thinking_tokens=thinking_part,
        answer_tokens=0 if thinking_on and stops_in_thinking else answer_words + 1,
        stopped_inside_thinking=thinking_on and stops_in_thinking,
        think_nothing=thinking_on and think_nothing,
        stop_token_piece=stop_token_piece,
    )


def render_message(plan: GenerationPlan, produced: int) -> tuple[str | None, str]:
    """(reasoning_content, content) of the first `produced` tokens, as SGLang's response has them."""
    reasoning, content = plan.split(0, produced)
    return (reasoning or None), content


def predict_outcome(
    settings: SimulatorSettings,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int | None = None,
    enable_thinking: bool = True,
    **options: Any,
) -> PredictedOutcome:
    """What the server will answer. `max_tokens` is the effective budget
    (`max_completion_tokens or max_tokens`); `options` are `plan_generation`'s keyword options."""
    prompt_tokens = count_prompt_tokens(messages)
    plan = plan_generation(settings, messages, max_tokens, enable_thinking, **options)
    produced = len(plan.pieces)
    reasoning, content = render_message(plan, produced)
    return PredictedOutcome(
        prompt_tokens=prompt_tokens,
        max_new_tokens=effective_budget(settings, prompt_tokens, max_tokens),
        thinking_on=plan.thinking_on,
        thinking_tokens=plan.thinking_tokens,
        answer_tokens=plan.answer_tokens,
        completion_tokens=produced,
        reasoning_tokens=plan.reasoning_tokens(produced),
        finish_reason=plan.finish_reason,
        matched_stop=plan.matched_stop,
        reasoning_content=reasoning,
        content=content,
        content_empty=content == "",
        stopped_inside_thinking=plan.stopped_inside_thinking,
        think_nothing=plan.think_nothing,
        context_error=context_error(settings, prompt_tokens, max_tokens),
    )
