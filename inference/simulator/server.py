"""Assemble and run the simulator: the aiohttp application, its middleware and the start-up phases.

Start-up as SGLang does it: while "loading" the port is closed; then the port opens with the server
"Starting" (`/health` 503, `/model_info` 200) for the warm-up (SGLang's warm-up request, unless
`--skip-server-warmup`, then `--warmup-seconds`); then it is "Up" and logs
"The server is fired up and ready to roll!".
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import msgspec
import prometheus_client
from aiohttp import web
from aiohttp.typedefs import Middleware

from inference.simulator.engine import Engine
from inference.simulator.faults import FLAKY_CRASH_LOG_MESSAGE, FaultController, die
from inference.simulator.metrics import SimulatorMetrics
from inference.simulator.protocol import internal_error
from inference.simulator.request_log import RequestLog
from inference.simulator.routes_admin import add_admin_routes
from inference.simulator.routes_chat import add_chat_routes, json_response
from inference.simulator.routes_info import add_info_routes
from inference.simulator.scheduler_log import SchedulerLog
from inference.simulator.settings import SimulatorSettings
from inference.simulator.state import STATE, ServerStatus, SimulatorState
from inference.simulator.warmup import run_warmup

OPEN_PATH_PREFIXES = ("/health", "/ready", "/metrics")  # never need the API key, as in SGLang
SHUTDOWN_TIMEOUT_WALL_S = 0.5
LISTEN_BACKLOG = 2048
READY_MESSAGE = "The server is fired up and ready to roll!"
# aiohttp answers 413 above 1 MiB by default; SGLang (uvicorn) has no body limit, so a long prompt must
# reach the context-length check and get its 400. 1 GiB only guards against runaway uploads.
MAX_REQUEST_BODY_BYTES = 1 << 30

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _make_middleware(settings: SimulatorSettings) -> Middleware:
    expected = f"Bearer {settings.api_key}" if settings.api_key else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            expected is not None
            and not request.path.startswith(OPEN_PATH_PREFIXES)
            and request.headers.get("Authorization") != expected
        ):
            return web.Response(
                body=msgspec.json.encode({"error": "Unauthorized"}),
                status=web.HTTPUnauthorized.status_code,
                content_type="application/json",
            )
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return json_response({"detail": "Not Found"}, web.HTTPNotFound.status_code)
        except web.HTTPMethodNotAllowed:
            return json_response({"detail": "Method Not Allowed"}, web.HTTPMethodNotAllowed.status_code)
        except web.HTTPException:
            raise
        except Exception as exc:  # SGLang answers an unexpected exception with its error body
            logging.getLogger(__name__).exception("Error while handling %s", request.path)
            error = internal_error(str(exc))
            return json_response(error.body(), error.status)

    return middleware


def build_app(state: SimulatorState) -> web.Application:
    app = web.Application(
        middlewares=[_make_middleware(state.settings)], client_max_size=MAX_REQUEST_BODY_BYTES
    )
    app[STATE] = state
    add_chat_routes(app)
    add_info_routes(app, enable_metrics=state.settings.enable_metrics)
    add_admin_routes(app)
    return app


def build_state(settings: SimulatorSettings, log: SchedulerLog, launch_command: str) -> SimulatorState:
    """The server's state; call inside the running event loop."""
    engine = Engine(settings, log)
    if settings.enable_metrics:
        # SGLang's multiprocess exposition has no *_created series
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    return SimulatorState(
        settings=settings,
        engine=engine,
        faults=FaultController(settings),
        requests=RequestLog(settings.request_log_size),
        metrics=SimulatorMetrics(settings, engine) if settings.enable_metrics else None,
        launch_command=launch_command,
    )


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds` (wall) or until stopped; True if stopped."""
    if seconds <= 0:
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def serve(settings: SimulatorSettings, launch_command: str) -> int:
    """Run until SIGTERM or SIGINT; returns the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log = SchedulerLog(settings.log_min_interval_wall_s)
    if settings.load_seconds > 0:
        log.info("Loading the model (simulated) for %.1f s; the port stays closed.", settings.load_seconds)
        if await _wait(stop, settings.load_seconds):
            return 0
    state = build_state(settings, log, launch_command)
    runner = web.AppRunner(
        build_app(state), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_WALL_S
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=LISTEN_BACKLOG)
    await site.start()
    engine_task = asyncio.create_task(state.engine.run())
    log.info(
        "Simulated SGLang 0.5.23 serving %s on http://%s:%d; capacity %.1f output tokens/s with %d "
        "running requests (model time), %.1f tokens/s wall at speedup %g",
        settings.model_name,
        settings.host,
        settings.port,
        settings.capacity_output_tokens_per_s(),
        settings.max_running_requests,
        settings.capacity_output_tokens_per_wall_s(),
        settings.speedup,
    )
    try:
        if not settings.skip_server_warmup:
            await run_warmup(state)
        state.engine.set_hung(settings.server_hang)
        if not await _wait(stop, settings.warmup_seconds):
            state.status = ServerStatus.UP
            log.info(READY_MESSAGE)
            if settings.crash_every_s is not None:
                loop.call_later(settings.crash_every_s, die, FLAKY_CRASH_LOG_MESSAGE, settings.crash_every_s)
            await stop.wait()
    finally:
        state.engine.close()
        await runner.cleanup()
        await engine_task
    return 0
