"""Health, readiness, model and server information, metrics, cache flush and abort (SGLang's routes)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import msgspec
from aiohttp import web

from inference.simulator.engine import Phase
from inference.simulator.routes_chat import json_response
from inference.simulator.state import STATE, ServerStatus, SimulatorState

SGLANG_VERSION = "0.5.23"
MODEL_TYPE = "qwen3_5"
ARCHITECTURES = ["Qwen3_5ForConditionalGeneration"]
FLUSH_OK_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
PROMETHEUS_CONTENT_TYPE = "text/plain"


async def health(http: web.Request) -> web.Response:
    """503 while starting; otherwise 200 with an empty body after a one-token generation's latency.

    During a whole-server hang it still answers 200 (judge liveness by token progress)."""
    state = http.app[STATE]
    if state.status is not ServerStatus.UP:
        return web.Response(status=web.HTTPServiceUnavailable.status_code)
    await asyncio.sleep(state.settings.health_latency_s / state.settings.speedup)
    return web.Response()


async def ready(http: web.Request) -> web.Response:
    return web.Response()


def _model_card(state: SimulatorState) -> dict[str, Any]:
    name = state.settings.model_name
    return {
        "id": name,
        "object": "model",
        "created": int(state.startup_time),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": state.settings.context_length,
    }


async def list_models(http: web.Request) -> web.Response:
    return json_response({"object": "list", "data": [_model_card(http.app[STATE])]})


async def get_model(http: web.Request) -> web.Response:
    state, name = http.app[STATE], http.match_info["name"]
    if name != state.settings.model_name:
        return json_response(
            {
                "error": {
                    "message": f"The model '{name}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            web.HTTPNotFound.status_code,
        )
    return json_response(_model_card(state))


async def model_info(http: web.Request) -> web.Response:
    settings = http.app[STATE].settings
    return json_response(
        {
            "model_path": settings.model_path,
            "served_model_name": settings.model_name,
            "tokenizer_path": settings.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None if settings.reasoning_parser == "none" else settings.reasoning_parser,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": MODEL_TYPE,
            "architectures": ARCHITECTURES,
        }
    )


def server_args(state: SimulatorState) -> dict[str, Any]:
    """The resolved arguments, under SGLang's names where SGLang has them (the API key is never shown)."""
    settings = state.settings
    args = {key: value for key, value in dataclasses.asdict(settings).items() if key != "api_key"}
    args.update(
        served_model_name=settings.model_name,
        tp_size=1,
        dp_size=1,
        pp_size=1,
        speculative_algorithm="NEXTN",
        enable_metrics=settings.enable_metrics,
        reasoning_parser=None if settings.reasoning_parser == "none" else settings.reasoning_parser,
    )
    return args


def simulator_info(state: SimulatorState) -> dict[str, Any]:
    settings, engine = state.settings, state.engine
    return {
        "capacity_output_tokens_per_s": settings.capacity_output_tokens_per_s(),
        "capacity_output_tokens_per_s_wall": settings.capacity_output_tokens_per_wall_s(),
        "speedup": settings.speedup,
        "max_running_requests": settings.max_running_requests,
        "decode_step_base_s": settings.decode_step_base_s,
        "decode_step_per_request_s": settings.decode_step_per_request_s,
        "accept_length": settings.accept_length,
        "seed": settings.seed,
        "num_running_reqs": engine.running,
        "num_queue_reqs": engine.queued,
        "chat_requests_received": state.faults.received,
        "faults": msgspec.to_builtins(state.faults.faults),
    }


async def server_info(http: web.Request) -> web.Response:
    state = http.app[STATE]
    settings, engine = state.settings, state.engine
    args = server_args(state)
    internal_state = {
        **args,
        "last_gen_throughput": engine.gen_throughput,
        "effective_max_running_requests_per_dp": settings.max_running_requests,
        "memory_usage": {"weight": 51.2, "kvcache": 120.0, "token_capacity": settings.max_total_tokens},
        "avg_spec_accept_length": engine.avg_accept_length(),
    }
    return json_response(
        {
            **args,
            "launch_command": state.launch_command,
            "max_total_num_tokens": settings.max_total_tokens,
            "max_req_input_len": settings.context_length - 1 - settings.num_reserved_tokens,
            "status": "ready" if state.status is ServerStatus.UP else "starting",
            "startup_time": state.startup_time,
            "kv_events": None,
            "internal_states": [internal_state],
            "version": SGLANG_VERSION,
            "frontend": "python",
            "simulator": simulator_info(state),
        }
    )


async def metrics(http: web.Request) -> web.Response:
    state = http.app[STATE]
    collected = state.metrics
    if collected is None:
        raise web.HTTPNotFound()
    state.engine.catch_up()  # the counters and gauges as of now, not as of the engine's last wake-up
    return web.Response(body=collected.exposition(), content_type=PROMETHEUS_CONTENT_TYPE, charset="utf-8")


async def flush_cache(http: web.Request) -> web.Response:
    engine = http.app[STATE].engine
    if engine.running or engine.queued:
        return web.Response(
            status=web.HTTPBadRequest.status_code,
            text=f"Cache not flushed because there are pending requests. "
            f"#queue-req: {engine.queued}, #running-req: {engine.running}",
        )
    engine.flush_cache()
    return web.Response(text=FLUSH_OK_TEXT)


async def abort_request(http: web.Request) -> web.Response:
    """Abort by rid (or all with abort_all): the request answers 200 with finish_reason "abort"."""
    state = http.app[STATE]
    try:
        body = msgspec.json.decode(await http.read() or b"{}")
    except msgspec.DecodeError as exc:
        return json_response(
            {
                "object": "error",
                "message": str(exc),
                "type": "Bad Request",
                "param": None,
                "code": web.HTTPBadRequest.status_code,
            },
            web.HTTPBadRequest.status_code,
        )
    if not isinstance(body, dict):
        body = {}
    rid, abort_all = body.get("rid"), bool(body.get("abort_all"))
    for key, request in list(state.in_flight.items()):
        if (abort_all or key == rid) and request.phase is not Phase.FINISHED:
            state.engine.abort(request)
    return web.Response()


def add_info_routes(app: web.Application, *, enable_metrics: bool) -> None:
    """SGLang mounts /metrics only with --enable-metrics; without it the route is a 404."""
    router = app.router
    for path in ("/health", "/health_generate"):
        router.add_get(path, health)
    router.add_get("/ready", ready)
    router.add_get("/v1/models", list_models)
    router.add_get("/v1/models/{name}", get_model)
    for path in ("/model_info", "/get_model_info"):
        router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        router.add_get(path, server_info)
    if enable_metrics:
        router.add_get("/metrics", metrics)
    router.add_route("*", "/flush_cache", flush_cache)
    router.add_post("/abort_request", abort_request)
