"""The few numbers every part of draftgen must agree on about an SGLang server, defined once."""

from __future__ import annotations

SGLANG_BASE_PORT = 30000  # SGLang's default port; the server of GPU i listens on base + i
REFERENCE_MAX_RUNNING_REQUESTS = 48  # the reference run's --max-running-requests, and a worker's window
BUDGET_GROWTH_FACTOR = 2  # a budget that cut the thinking short is retried (or suggested) this much larger
