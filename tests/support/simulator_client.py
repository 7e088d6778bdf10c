"""An openai client for a simulator, configured as the workers configure theirs (explicit timeout,
no retries), and the one-message conversation the simulator tests send."""

from __future__ import annotations

import openai
from openai.types.chat import ChatCompletionMessageParam

from inference.simulator import SimulatorProcess

CLIENT_TIMEOUT_S = 15.0
API_KEY = "unused-by-the-default-server"


def make_client(
    sim: SimulatorProcess, api_key: str = API_KEY, timeout_s: float = CLIENT_TIMEOUT_S
) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key=api_key, max_retries=0, timeout=timeout_s)


def user(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]
