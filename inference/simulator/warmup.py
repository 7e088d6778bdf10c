"""SGLang's start-up warm-up request, as the simulator runs it before it says it is up.

SGLang 0.5.23 (`entrypoints/http_server.py`, `_execute_server_warmup`) sends one greedy `/generate` of
"The capital city of France is" with `max_new_tokens` 8 while `/health` still answers 503, unless
`--skip-server-warmup`. Its forward passes create the `realtime_tokens_total` series and count a request
in the completion counters, so a server's `/metrics` shows a per-step counter from its start: a liveness
watch judges a hang on its very first batch by that counter, not by the completion counters.
"""

from __future__ import annotations

from inference.simulator.engine import SimRequest
from inference.simulator.state import SimulatorState
from inference.simulator.token_ids import word_token_id

WARMUP_TEXT = "The capital city of France is"
WARMUP_NEW_TOKENS = 8


async def run_warmup(state: SimulatorState) -> None:
    """Run the warm-up request through the scheduler and count it as SGLang does, then return."""
    words = WARMUP_TEXT.split()
    request = SimRequest(
        prompt_tokens=len(words),
        target_tokens=WARMUP_NEW_TOKENS,
        streaming=False,
        prompt_ids=() if state.settings.disable_radix_cache else [word_token_id(w) for w in words],
    )
    state.engine.submit(request)
    await request.done.wait()
    if state.metrics is not None:
        state.metrics.observe_finished(request, request.prompt_tokens, request.final_tokens)
