"""Prompts whose dataset answers say something about the target's length, as a real dataset's do.

The simulator draws a request's length from its messages alone, so a bench prompt carries no hint of it
and no order can put the long ones first. A real dataset row usually comes with an answer (an earlier
model's), whose length correlates with the target's: both depend on the prompt (a proof thinks longer
than a greeting), neither fixes the other (one prompt's lengths are themselves heavy-tailed). This gives
each prompt the length of a dataset answer (all the ordering reads of it): the target's own length (the
simulator's thinking model, a pure function of the messages) times a lognormal noise of `sigma`. Sigma 0
is a clairvoyant hint, 1.2 a Spearman correlation of about 0.7 (a learned predictor's figure in the
scheduling literature), larger weaker. `hint_correlation` measures what a run's server logs show.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

import msgspec

from core.records import Prompt, SamplingSettings
from inference.simulator import RequestRecord, SimulatorSettings, predict_outcome
from producer.enqueue.work_order import CHARS_PER_TOKEN

SIGNAL_SEED = 31


def target_tokens(prompt: Prompt, settings: SimulatorSettings, sampling: SamplingSettings) -> int:
    """The output tokens the simulator will give this prompt's request."""
    messages = [{"role": message.role, "content": message.content} for message in prompt.messages]
    return predict_outcome(settings, messages, sampling.max_tokens).completion_tokens


def with_dataset_answers(
    prompts: Sequence[Prompt],
    settings: SimulatorSettings,
    sampling: SamplingSettings,
    *,
    sigma: float,
    seed: int = SIGNAL_SEED,
) -> list[Prompt]:
    """Each single prompt as enqueue reads a row with an answer: its length kept as `known_answer_chars`
    (intake/rows.py), the target's length times exp(N(0, sigma)); the request is the same."""
    draw = random.Random(seed)
    return [
        msgspec.structs.replace(
            prompt,
            known_answer_chars=max(
                1,
                round(
                    target_tokens(prompt, settings, sampling)
                    * CHARS_PER_TOKEN
                    * math.exp(draw.gauss(0.0, sigma))
                ),
            ),
        )
        for prompt in prompts
    ]


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 0, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2
        start = end + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's over the ranks), NaN when either side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    mean_x, mean_y = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mean_x) * (b - mean_y) for a, b in zip(rx, ry, strict=True))
    var_x = sum((a - mean_x) ** 2 for a in rx)
    var_y = sum((b - mean_y) ** 2 for b in ry)
    return cov / math.sqrt(var_x * var_y) if var_x and var_y else math.nan


def hint_correlation(prompts: Sequence[Prompt], records: Sequence[RequestRecord], run: str) -> float:
    """Spearman between each prompt's dataset answer and the output tokens its requests got."""
    tokens: dict[str, int] = defaultdict(int)
    for record in records:
        head, _, rest = record.rid.partition(":")
        if head == run:
            tokens[rest.partition(":")[0]] += record.completion_tokens
    hinted = [
        (p.known_answer_chars, tokens[p.id]) for p in prompts if p.id in tokens and p.known_answer_chars
    ]
    return spearman([h for h, _ in hinted], [t for _, t in hinted]) if len(hinted) > 1 else math.nan
