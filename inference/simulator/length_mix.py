"""Named mixes of output lengths: which lognormal a request's thinking and answer lengths are drawn from.

`single`: one lognormal each, from `--thinking-tokens-mean/-sigma` and `--answer-tokens-mean/-sigma`
(the default: mean thinking 1,900 tokens, sigma 0.6, a short tail).

`reasoning`: what reasoning traces of Qwen3.5/3.6-class models look like on a mixed dataset.
- 80% reasoning prompts: thinking with a median of 4,500 tokens and sigma 1.2 (mean about 9,200),
  so about 5% of them think past a 32,768-token budget. Published figures: Qwen3.5-4B/9B at a
  36,864 context have median outputs of 4,268-5,623 tokens and truncate 19-37% of hard benchmark
  prompts (allenai/olmo-eval#399); Qwen3-30B-A3B-Thinking averages 18,102 tokens on AIME
  (NVIDIA-NeMo/Skills PR 1256). A general training set is easier than AIME, hence the lower median.
- 20% chat prompts: a short think (median 300 tokens, sigma 0.8) before the answer.
Answers: median 350 tokens, sigma 0.7, for both.
Overall, at a 32,768-token budget, 4.2% of requests reach the budget inside thinking, the output
median is 3,500 tokens and the mean 6,900 (4,000 prompts drawn): the tail carries most of the
tokens, as on real fleets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SINGLE = "single"
REASONING = "reasoning"
LENGTH_MIX_CHOICES = (SINGLE, REASONING)


@dataclass(frozen=True)
class Lognormal:
    median_tokens: float
    sigma: float

    @classmethod
    def with_mean(cls, mean_tokens: float, sigma: float) -> Lognormal:
        return cls(mean_tokens * math.exp(-sigma * sigma / 2), sigma)

    @property
    def mu(self) -> float:
        return math.log(self.median_tokens)


@dataclass(frozen=True)
class MixComponent:
    share: float  # of requests
    thinking: Lognormal
    answer: Lognormal


REASONING_MIX = (
    MixComponent(share=0.8, thinking=Lognormal(4_500, 1.2), answer=Lognormal(350, 0.7)),
    MixComponent(share=0.2, thinking=Lognormal(300, 0.8), answer=Lognormal(350, 0.7)),
)
