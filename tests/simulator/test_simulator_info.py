"""Health, readiness, model and server info, and the Prometheus metrics."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from inference.simulator import SimulatorProcess
from tests.support.simulator_client import user

SCHEDULER_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
REQUEST_LABELS = {"model_name", "engine_type", "is_streaming"}


def test_health_and_ready_answer_200_with_an_empty_body(simulator: SimulatorProcess) -> None:
    for path in ("/health", "/health_generate", "/ready"):
        response = httpx.get(simulator.url + path, timeout=10)
        assert (response.status_code, response.content) == (200, b""), path


def test_models_and_model_info_describe_the_served_model(simulator: SimulatorProcess) -> None:
    models = httpx.get(simulator.base_url + "/models", timeout=10).json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["id"] == card["root"] == "Qwen/Qwen3.6-27B"
    assert (card["owned_by"], card["max_model_len"]) == ("sglang", 262_144)
    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(simulator.url + path, timeout=10).json()
        assert info["reasoning_parser"] == "qwen3" and info["weight_version"] == "default"


def test_server_info_states_the_capacity_beside_sglangs_keys(simulator: SimulatorProcess) -> None:
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(simulator.url + path, timeout=10).json()
        assert (info["version"], info["status"], info["frontend"]) == ("0.5.23", "ready", "python")
        assert info["max_total_num_tokens"] > 0 and info["speculative_algorithm"] == "NEXTN"
        assert "avg_spec_accept_length" in info["internal_states"][0]
        capacity = info["simulator"]
        assert 2200 <= capacity["capacity_output_tokens_per_s"] <= 2400
        assert (
            capacity["capacity_output_tokens_per_s_wall"] == capacity["capacity_output_tokens_per_s"] * 1000
        )


def test_the_accept_length_is_reported_after_decoding(
    client: openai.OpenAI, simulator: SimulatorProcess
) -> None:
    client.chat.completions.create(model="default", messages=user("accept"), max_tokens=400)
    accept_length = simulator.admin.server_info()["internal_states"][0]["avg_spec_accept_length"]
    assert 3.0 <= accept_length <= 3.6


def test_metrics_carry_sglangs_names_types_and_labels(
    client: openai.OpenAI, simulator: SimulatorProcess
) -> None:
    client.chat.completions.create(model="default", messages=user("metrics"), max_tokens=30)
    families = {
        family.name: family
        for family in text_string_to_metric_families(httpx.get(simulator.url + "/metrics", timeout=10).text)
    }
    gauges = (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:token_usage",
    )
    for name in gauges:
        assert families[name].type == "gauge", name
        assert set(families[name].samples[0].labels) == SCHEDULER_LABELS, name
    for name in ("sglang:prompt_tokens", "sglang:generation_tokens", "sglang:num_requests"):
        assert families[name].type == "counter", name
        assert {sample.name for sample in families[name].samples} == {name + "_total"}
        assert set(families[name].samples[0].labels) == REQUEST_LABELS
    for name in (
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:request_time_per_output_token_seconds",
        "sglang:queue_time_seconds",
    ):
        assert families[name].type == "histogram", name
    generated = sum(sample.value for sample in families["sglang:generation_tokens"].samples)
    assert generated >= 30


def test_metrics_are_not_mounted_without_enable_metrics(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(enable_metrics=False)
    response = httpx.get(sim.url + "/metrics", timeout=10)
    assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})


def test_the_log_has_sglangs_ready_and_batch_lines(
    client: openai.OpenAI, simulator: SimulatorProcess
) -> None:
    client.chat.completions.create(model="default", messages=user("log lines"), max_tokens=500)
    log = simulator.log_text()
    assert "The server is fired up and ready to roll!" in log
    assert "Prefill batch, #new-seq: " in log
    assert "Decode batch, #running-req: " in log and "accept len: " in log
