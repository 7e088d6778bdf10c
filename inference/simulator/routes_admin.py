"""Simulator-only admin routes (no API key needed): faults, and the log of finished requests.

- `GET /admin/faults` -> the current `Faults` as JSON.
- `POST /admin/faults` with a partial `Faults` object -> the updated `Faults` (400 on a bad value).
  Setting `crash_after_requests: N` counts N more chat requests from now.
- `GET /admin/requests[?rid=R]` -> `{"requests": [RequestRecord...], "total": n}`, oldest first.
- `POST /admin/reset` -> clears the request log: `{"cleared": n}`.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from inference.simulator.routes_chat import json_response
from inference.simulator.state import STATE

ADMIN_PREFIX = "/admin/"


def _admin_error(message: str) -> web.Response:
    return json_response(
        {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": web.HTTPBadRequest.status_code,
        },
        web.HTTPBadRequest.status_code,
    )


async def get_faults(http: web.Request) -> web.Response:
    return json_response(http.app[STATE].faults.faults)


async def set_faults(http: web.Request) -> web.Response:
    state = http.app[STATE]
    try:
        changes = msgspec.json.decode(await http.read())
        if not isinstance(changes, dict):
            raise ValueError("the body must be a JSON object")
        faults = state.faults.update(changes)
    except (msgspec.DecodeError, ValueError) as exc:
        return _admin_error(str(exc))
    state.engine.set_hung(faults.server_hang)
    return json_response(faults)


async def list_requests(http: web.Request) -> web.Response:
    log = http.app[STATE].requests
    return json_response({"requests": log.records(http.query.get("rid")), "total": log.total})


async def reset_requests(http: web.Request) -> web.Response:
    return json_response({"cleared": http.app[STATE].requests.clear()})


def add_admin_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/admin/faults", get_faults)
    router.add_post("/admin/faults", set_faults)
    router.add_get("/admin/requests", list_requests)
    router.add_post("/admin/reset", reset_requests)
