"""`POST /v1/chat/completions`: validation, faults, scheduling, then a JSON body or an SSE stream."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from inference.simulator.engine import Phase, QueueFullError, SimRequest
from inference.simulator.faults import PROMPT_CRASH_LOG_MESSAGE, Drawn, Fate, die
from inference.simulator.protocol import (
    RECORDED_FIELDS,
    ChatRequest,
    RequestError,
    bad_request,
    http_exception,
    internal_error,
    parse_chat_request,
    validate_chat_request,
)
from inference.simulator.request_log import RequestRecord
from inference.simulator.responses import (
    FINISH_DELTA,
    FIRST_DELTA,
    ChatResult,
    Usage,
    chat_completion_body,
    chunk_body,
    content_delta,
    empty_choices_chunk,
    reasoning_delta,
    spec_tokens_details,
)
from inference.simulator.settings import STREAM_CHUNKING_STEP
from inference.simulator.state import STATE, SimulatorState
from inference.simulator.thinking import GenerationPlan, messages_hash, plan_generation, render_message
from inference.simulator.token_ids import prompt_token_ids, response_token_ids

INJECTED_500_MESSAGE = "Simulated fault: the engine raised an error."
INJECTED_503_MESSAGE = "Simulated fault: the server is temporarily unavailable."
SSE_DONE = b"data: [DONE]\n\n"
# Header opt-ins equivalent to the body flags (`serving_chat.py` `_convert_to_internal_request`).
RETURN_INPUT_IDS_HEADER = "x-sglext-return-input-ids"
RETURN_OUTPUT_IDS_HEADER = "x-sglext-return-output-ids"
HEADER_ON = "1"


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def _sse(body: Any) -> bytes:
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


def _drop_connection(http: web.Request) -> web.Response:
    """Close the socket without (the rest of) a response, like a server dying mid-request."""
    if http.transport is not None:
        http.transport.abort()
    return web.Response()


class _ChatCall:
    """One chat request from arrival to its record in the request log."""

    def __init__(self, state: SimulatorState, http: web.Request) -> None:
        self.state = state
        self.http = http
        self.created = int(time.time())

    async def handle(self) -> web.StreamResponse:
        received_at = time.time()
        try:
            raw, body = parse_chat_request(self.http.content_type, await self.http.read())
        except RequestError as error:
            self.state.requests.add(
                RequestRecord(
                    rid=uuid.uuid4().hex,
                    messages_hash="",
                    max_tokens=None,
                    max_completion_tokens=None,
                    sampling={},
                    stream=False,
                    status="rejected",
                    http_status=error.status,
                    error=error.message,
                    received_at=received_at,
                    finished_at=time.time(),
                )
            )
            return json_response(error.body(), error.status)
        self.state.faults.on_chat_request()
        if self.http.headers.get(RETURN_INPUT_IDS_HEADER) == HEADER_ON:
            body.return_input_ids_in_sglext = True
        if self.http.headers.get(RETURN_OUTPUT_IDS_HEADER) == HEADER_ON:
            body.return_output_ids_in_sglext = True
        record = RequestRecord(
            rid=body.rid or uuid.uuid4().hex,
            messages_hash=messages_hash(body.messages),
            messages=raw.get("messages") if self.state.settings.log_request_messages else None,
            max_tokens=body.max_tokens,
            max_completion_tokens=body.max_completion_tokens,
            sampling={key: raw[key] for key in RECORDED_FIELDS if key in raw},
            stream=body.stream,
            received_at=received_at,
        )
        try:
            return await self._serve(body, record)
        except RequestError as error:
            if record.status == "ok":
                record.status = "rejected"
            record.http_status, record.error = error.status, error.message
            return json_response(error.body(), error.status)
        except asyncio.CancelledError:
            if record.status == "ok":
                record.status = "cancelled"
            raise
        finally:
            record.finished_at = time.time()
            self.state.requests.add(record)

    async def _serve(self, body: ChatRequest, record: RequestRecord) -> web.StreamResponse:
        state, settings = self.state, self.state.settings
        record.prompt_tokens = validate_chat_request(settings, body)
        if record.rid in state.in_flight:
            raise bad_request(f"Duplicate request ID detected: {record.rid}")
        drawn = state.faults.draw(body.messages)
        fate = drawn.fate
        self._fail_at_once(drawn, record)
        plan = plan_generation(
            settings,
            body.messages,
            body.max_new_tokens,
            body.enable_thinking,
            stop=body.stop_strings,
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            separate_reasoning=body.separate_reasoning,
            no_stop_trim=body.no_stop_trim,
        )
        produce = len(plan.pieces)
        if fate is Fate.DROP:
            produce = min(produce, max(1, produce // 2))
        request = SimRequest(
            prompt_tokens=record.prompt_tokens,
            target_tokens=produce,
            streaming=body.stream,
            prompt_ids=()
            if settings.disable_radix_cache
            else prompt_token_ids(body.messages, plan.thinking_on),
            stalled=fate is Fate.STALL,
            retract_pause_wall_s=drawn.pause_s if fate is Fate.RETRACT else 0.0,
        )
        state.in_flight[record.rid] = request
        submitted = False
        try:
            if fate is Fate.HANG:
                record.status = "hung"
                await asyncio.get_running_loop().create_future()  # never resolved: the client gives up
            if fate is Fate.STALL:
                record.status = "hung"  # admitted, then silent until the client gives up
            self._submit(request, fate, record)
            submitted = True
            if body.stream:
                return await self._stream(body, plan, request, record, drop=fate is Fate.DROP)
            await request.done.wait()
            self._settle(plan, request, record)
            if fate is Fate.DROP:
                record.status = "dropped"
                return _drop_connection(self.http)
            return json_response(chat_completion_body(self._result(body, plan, request, record)))
        finally:
            state.in_flight.pop(record.rid, None)
            if submitted and request.phase is not Phase.FINISHED:
                state.engine.abort(request)  # the client went away: free the slot, as SGLang does
            if request.phase is Phase.FINISHED:
                self._settle(plan, request, record)
                if state.metrics is not None:
                    state.metrics.observe_finished(request, record.prompt_tokens, record.completion_tokens)

    def _fail_at_once(self, drawn: Drawn, record: RequestRecord) -> None:
        """The faults that end a request as it arrives: the process dies (now, or `after_s` into the
        request), or an error is answered."""
        fate = drawn.fate
        if fate is Fate.CRASH and drawn.after_s:
            asyncio.get_running_loop().call_later(drawn.after_s, die, PROMPT_CRASH_LOG_MESSAGE)
        elif fate is Fate.CRASH:
            die(PROMPT_CRASH_LOG_MESSAGE)
        if fate is Fate.ERROR:
            record.status = "error"
            if self.state.faults.faults.error_status == web.HTTPServiceUnavailable.status_code:
                raise http_exception(web.HTTPServiceUnavailable.status_code, INJECTED_503_MESSAGE)
            raise internal_error(INJECTED_500_MESSAGE)

    def _submit(self, request: SimRequest, fate: Fate, record: RequestRecord) -> None:
        """Queue the request at the scheduler; a wedge fault hangs the scheduler as it takes it in."""
        state = self.state
        try:
            state.engine.submit(request)
        except QueueFullError as exc:
            raise http_exception(web.HTTPServiceUnavailable.status_code, str(exc)) from exc
        if fate is Fate.WEDGE:  # nothing produces a token any more, /health still 200 (as server_hang)
            record.status = "hung"
            state.faults.update({"server_hang": True})
            state.engine.set_hung(True)

    def _settle(self, plan: GenerationPlan, request: SimRequest, record: RequestRecord) -> None:
        """Copy the final counts into the record."""
        record.completion_tokens = request.final_tokens
        record.cached_tokens = request.cached_tokens
        record.reasoning_tokens = plan.reasoning_tokens(request.final_tokens)
        record.finish_reason = "abort" if request.aborted else plan.finish_reason
        record.http_status = record.http_status or 200
        if request.first_token_wall_s is not None:
            record.first_token_at = record.received_at + (request.first_token_wall_s - request.arrival_wall_s)

    def _result(
        self, body: ChatRequest, plan: GenerationPlan, request: SimRequest, record: RequestRecord
    ) -> ChatResult:
        produced = request.final_tokens
        reasoning, content = render_message(plan, produced)
        sglext: dict[str, Any] = {}
        if body.return_spec_tokens_details:
            details = spec_tokens_details(self.state.settings, produced, request.verify_count)
            if details is not None:
                sglext["spec_tokens_details"] = details
        # return_prompt_token_ids alone gives the choice its prompt ids; return_token_ids gives both
        in_choice = body.return_prompt_token_ids or body.return_token_ids
        wants_prompt_ids = in_choice or body.return_input_ids_in_sglext
        prompt_ids = (  # the prefix cache's key is the same ids, already made unless the cache is off
            (list(request.prompt_ids) or prompt_token_ids(body.messages, plan.thinking_on))
            if wants_prompt_ids
            else None
        )
        response_ids = (
            response_token_ids(plan, produced)
            if body.return_token_ids or body.return_output_ids_in_sglext
            else None
        )
        if body.return_input_ids_in_sglext:
            sglext["input_ids"] = prompt_ids
        if body.return_output_ids_in_sglext:
            sglext["output_ids"] = [response_ids]
        return ChatResult(
            rid=record.rid,
            created=self.created,
            model=body.model,
            reasoning_content=reasoning,
            content=content,
            finish_reason="abort" if request.aborted else plan.finish_reason,
            matched_stop=None if request.aborted else plan.matched_stop,
            usage=Usage(
                record.prompt_tokens,
                produced,
                plan.reasoning_tokens(produced),
                cached_tokens=request.cached_tokens if self.state.settings.enable_cache_report else None,
            ),
            sglext=sglext or None,
            prompt_token_ids=prompt_ids if in_choice else None,
            response_token_ids=response_ids if body.return_token_ids else None,
        )

    async def _stream(
        self,
        body: ChatRequest,
        plan: GenerationPlan,
        request: SimRequest,
        record: RequestRecord,
        *,
        drop: bool,
    ) -> web.StreamResponse:
        # SGLang answers 200 with the first chunk (it waits for the first output, so that an error up
        # to then is still a plain HTTP error): a request waiting in the queue has no headers yet.
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        rid, model, created = record.rid, body.model, self.created
        emitted, started = 0, False
        held_reasoning: list[str] = []
        while True:
            await request.progress.wait()
            request.progress.clear()
            produced = self.state.engine.produced(request)
            events: list[bytes] = []
            if not started and (produced > 0 or request.phase is Phase.FINISHED):
                started = True
                await response.prepare(self.http)
                events.append(_sse(chunk_body(rid, created, model, FIRST_DELTA)))
            for cut in self._chunk_ends(request, emitted):
                reasoning, content = plan.split(emitted, cut)
                emitted = cut
                if reasoning and body.stream_reasoning:
                    events.append(_sse(chunk_body(rid, created, model, reasoning_delta(reasoning))))
                elif reasoning:
                    held_reasoning.append(reasoning)
                if content:
                    events += self._held_reasoning_events(record, body, held_reasoning)
                    events.append(_sse(chunk_body(rid, created, model, content_delta(content))))
            if events:  # the chunks of every step since the last wake-up, in one write
                await response.write(b"".join(events))
            if request.phase is Phase.FINISHED:
                break
        self._settle(plan, request, record)
        if drop:
            record.status = "dropped"
            return _drop_connection(self.http)
        result = self._result(body, plan, request, record)
        await response.write(
            b"".join(self._held_reasoning_events(record, body, held_reasoning))
            + _sse(
                chunk_body(
                    rid,
                    created,
                    model,
                    FINISH_DELTA,
                    finish_reason=result.finish_reason,
                    matched_stop=result.matched_stop,
                )
            )
        )
        if result.sglext is not None:
            await response.write(_sse(empty_choices_chunk(rid, created, model, sglext=result.sglext)))
        if body.include_usage(self.state.settings):
            await response.write(_sse(empty_choices_chunk(rid, created, model, usage=result.usage.body())))
        await response.write(SSE_DONE)
        await response.write_eof()
        return response

    def _chunk_ends(self, request: SimRequest, emitted: int) -> list[int]:
        """Token counts at which the chunks since `emitted` end: SGLang's, each its own chunk (step
        chunking), or merged into one per write (wall chunking)."""
        engine, settings = self.state.engine, self.state.settings
        if settings.stream_chunking == STREAM_CHUNKING_STEP:
            return engine.stream_cuts(request, emitted)
        if settings.stream_interval == 1:  # every step ends a chunk: merged, they end at what is produced
            produced = engine.produced(request)
            return [produced] if produced > emitted else []
        return engine.stream_cuts(request, emitted)[-1:]

    def _held_reasoning_events(
        self, record: RequestRecord, body: ChatRequest, held: list[str]
    ) -> list[bytes]:
        """With stream_reasoning false, the reasoning goes out in one piece before the content."""
        if not held:
            return []
        text = "".join(held)
        held.clear()
        return [_sse(chunk_body(record.rid, self.created, body.model, reasoning_delta(text)))]


async def chat_completions(http: web.Request) -> web.StreamResponse:
    return await _ChatCall(http.app[STATE], http).handle()


def add_chat_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
