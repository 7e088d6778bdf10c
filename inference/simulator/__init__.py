"""A CPU simulator of an SGLang 0.5.23 server (thinking model, qwen3 reasoning parser, NEXTN).

Public API:
- `SimulatorSettings` (settings), `settings_to_argv` (settings -> CLI options);
- `predict_outcome`, `count_prompt_tokens`, `messages_hash`, `PredictedOutcome` (the thinking model);
- `SimulatorProcess` (a real server subprocess for tests and benchmarks);
- `Faults`, `RequestRecord` and the admin helpers in `inference.simulator.admin`.
Start it with `python -m inference simulate --port 30000 [options]`; see docs/simulator.md.
"""

from inference.simulator.admin import AdminClient
from inference.simulator.faults import Faults
from inference.simulator.process import SimulatorProcess
from inference.simulator.request_log import RequestRecord
from inference.simulator.settings import SimulatorSettings, settings_to_argv
from inference.simulator.thinking import (
    EOS_TOKEN_ID,
    PredictedOutcome,
    count_prompt_tokens,
    messages_hash,
    predict_outcome,
)

__all__ = [
    "EOS_TOKEN_ID",
    "AdminClient",
    "Faults",
    "PredictedOutcome",
    "RequestRecord",
    "SimulatorProcess",
    "SimulatorSettings",
    "count_prompt_tokens",
    "messages_hash",
    "predict_outcome",
    "settings_to_argv",
]
