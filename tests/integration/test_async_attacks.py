"""Hostile model endpoints against the asynchronous model calls (``worker.model.async_client``,
``worker.turn.async_calls``): a local HTTP server (``Hostile``) that misbehaves on purpose, first
against the client alone, then behind real workers on a private stack.

- the client: a stream that trickles forever (the call's deadline cuts it), a stream that stays
  open, pings or breaks after its terminal event (the reply in hand is kept: retrying would pay
  twice; the synchronous client too), bare-CR line ends and a CRLF cut between chunks, Unicode
  line separators inside an event (both clients), an event of 50 MB, invalid UTF-8, a non-JSON
  200, a reset mid-stream;
- the workers: HTTP 500 then success (retried, paid once), HTTP 429 forever (the turn fails
  with the reason after the retries), a reply followed by a stream left open, a turn cancelled
  during its call (the call aborted) or its retry backoff, duplicate deliveries during a call, a worker killed
  mid-call, a warm shutdown with calls in flight (handed on, or finished within the drain), and
  hundreds of turns on a threads pool of 2.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import threading
import time
from collections import Counter
from typing import Any, Awaitable, Callable

import orjson
import pytest

from devtools.scripted_gateway import ScriptedGateway
from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg
from worker.model.async_client import AsyncModelClient
from worker.model.interface import GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient

Writer = asyncio.StreamWriter
# (request body, its writer, how many requests this model had before it) -> the exchange written
Behaviour = Callable[[dict[str, Any], Writer, int], Awaitable[None]]

COMPLETED = {
    "type": "response.completed",
    "response": {
        "id": "resp_1",
        "status": "completed",
        "output": [
            {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
        ],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    },
}
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(payload: dict[str, Any]) -> bytes:
    """A server-sent event carrying ``payload``, as one chunk."""
    return chunk(b"data: " + orjson.dumps(payload) + b"\n\n")


def reset(writer: Writer) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0): a connection reset, not an end."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def send_json(writer: Writer, status: int, payload: dict[str, Any]) -> None:
    body = orjson.dumps(payload)
    head = b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        status,
        len(body),
    )
    writer.write(head + body)
    await writer.drain()


class Hostile:
    """An HTTP/1.1 server on its own event loop thread; ``behaviours[model]`` answers each POST
    (a connection per request). ``calls`` counts the requests per model; ``base_url`` ends ``/v1``."""

    def __init__(self, behaviours: dict[str, Behaviour]):
        self.behaviours = behaviours
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            body = orjson.loads(await reader.readexactly(length))
            model = body.get("model", "")
            with self._lock:
                n = self.calls[model]
                self.calls[model] += 1
            await self.behaviours[model](body, writer, n)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def _shut() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(_shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# ----- behaviours ---------------------------------------------------------------------------------
async def trickle(body: dict[str, Any], writer: Writer, n: int) -> None:
    """A stream that never ends: an SSE comment byte every 0.2 s (never a read timeout)."""
    writer.write(SSE_HEAD)
    while True:
        writer.write(chunk(b":"))
        await writer.drain()
        await asyncio.sleep(0.2)


async def completed_then_silent(body: dict[str, Any], writer: Writer, n: int) -> None:
    """The terminal event, then the stream stays open, silent."""
    writer.write(SSE_HEAD + event(COMPLETED))
    await writer.drain()
    await asyncio.sleep(3600)


async def completed_then_pings(body: dict[str, Any], writer: Writer, n: int) -> None:
    """The terminal event, then keep-alive comments forever."""
    writer.write(SSE_HEAD + event(COMPLETED))
    while True:
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(chunk(b": ping\n\n"))


async def completed_then_reset(body: dict[str, Any], writer: Writer, n: int) -> None:
    """The terminal event, then a connection reset before the body's end."""
    writer.write(SSE_HEAD + event(COMPLETED))
    await writer.drain()
    await asyncio.sleep(0.2)
    reset(writer)


async def reset_mid_stream(body: dict[str, Any], writer: Writer, n: int) -> None:
    writer.write(SSE_HEAD + event({"type": "response.output_text.delta", "output_index": 0, "delta": "h"}))
    await writer.drain()
    await asyncio.sleep(0.2)
    reset(writer)


async def huge_event(body: dict[str, Any], writer: Writer, n: int) -> None:
    """A 50 MB ``response.completed`` written in 16 KiB chunks."""
    payload = b"data: " + orjson.dumps({**COMPLETED, "padding": "x" * 50_000_000}) + b"\n\n"
    writer.write(SSE_HEAD)
    for i in range(0, len(payload), 16384):
        writer.write(chunk(payload[i : i + 16384]))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def invalid_utf8(body: dict[str, Any], writer: Writer, n: int) -> None:
    writer.write(SSE_HEAD + chunk(b"data: \xff\xfe{\xc3(}\n\n") + event(COMPLETED) + b"0\r\n\r\n")
    await writer.drain()


async def non_json_200(body: dict[str, Any], writer: Writer, n: int) -> None:
    page = b"<html>bad gateway</html>"
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (len(page), page)
    )
    await writer.drain()


async def cr_line_ends(body: dict[str, Any], writer: Writer, n: int) -> None:
    """Line ends of a bare CR, as the SSE standard allows (CRLF, LF or CR)."""
    writer.write(SSE_HEAD + chunk(b": hello\r\r") + chunk(b"data: " + orjson.dumps(COMPLETED) + b"\r\r") + b"0\r\n\r\n")
    await writer.drain()


async def crlf_across_chunks(body: dict[str, Any], writer: Writer, n: int) -> None:
    """One event of two ``data:`` lines (the SSE decoder joins them with a newline), its CRLF line
    ends cut between two chunks: the CR ends one chunk, the LF starts the next."""
    first, rest = orjson.dumps(COMPLETED).split(b",", 1)
    writer.write(SSE_HEAD + chunk(b"data: " + first + b",\r"))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(chunk(b"\ndata: " + rest + b"\r"))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(chunk(b"\n\r\n") + b"0\r\n\r\n")
    await writer.drain()


SEPARATORS = "x\u2028y\u0085z\u2029w\x0cv"  # line separators to str.splitlines, not to SSE


async def raw_separators(body: dict[str, Any], writer: Writer, n: int) -> None:
    """A reply whose text holds Unicode line separators, sent raw (orjson, like llama.cpp's and
    vLLM's servers, does not escape them)."""
    reply = {**COMPLETED, "response": {**COMPLETED["response"]}}
    reply["response"]["output"] = [
        {"type": "message", "id": "m", "role": "assistant", "content": [{"type": "output_text", "text": SEPARATORS}]}
    ]
    delta = {"type": "response.output_text.delta", "output_index": 0, "delta": SEPARATORS}
    writer.write(SSE_HEAD + event(delta) + event(reply) + b"0\r\n\r\n")
    await writer.drain()


# ----- the client alone ---------------------------------------------------------------------------
@pytest.fixture
def hostile():
    server = Hostile(
        {
            "trickle": trickle,
            "silent": completed_then_silent,
            "pings": completed_then_pings,
            "reset-after": completed_then_reset,
            "reset-mid": reset_mid_stream,
            "huge": huge_event,
            "utf8": invalid_utf8,
            "nonjson": non_json_200,
            "cr": cr_line_ends,
            "crlf-cut": crlf_across_chunks,
            "separators": raw_separators,
        }
    )
    yield server
    server.stop()


def _stream(base_url: str, model: str, on_delta: Callable[[Any], None] = lambda d: None, **kw: Any) -> Any:
    async def go() -> Any:
        client = AsyncModelClient(RESPONSES, base_url, **kw)
        try:
            return await client.stream(ModelRequest(model=model, input=[]), on_delta)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_stream_that_trickles_forever_is_cut_at_the_deadline(hostile):
    """A byte every 0.2 s never trips a 1 s read timeout; the call's deadline ends it (retryable)."""
    with pytest.raises(GatewayError) as cut:
        _stream(hostile.base_url, "trickle", timeout=1.0, deadline=2.0)
    assert cut.value.retryable and "timed out" in str(cut.value)


@pytest.mark.parametrize("model", ["silent", "pings", "reset-after"])
def test_the_reply_survives_what_follows_its_terminal_event(hostile, model):
    """The reply arrived (paid for): a body that then stays open, keeps pinging or breaks must not
    turn it into a retryable error (a retry pays again)."""
    reply = _stream(hostile.base_url, model, timeout=3.0, deadline=60.0)
    assert reply.text == "hi"


@pytest.mark.parametrize("model", ["silent", "pings", "reset-after"])
def test_the_synchronous_client_keeps_its_reply_too(hostile, model):
    """The same through ``SyncModelClient`` (``wire_format.read_events``): before, a read timeout or
    a reset after the reply raised a retryable error, and keep-alive comments held the thread forever."""
    got: list[Any] = []

    def call() -> None:
        try:
            got.append(
                SyncModelClient(RESPONSES, hostile.base_url, timeout=1.0).stream(
                    ModelRequest(model=model, input=[]), lambda d: None
                )
            )
        except GatewayError as exc:
            got.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(30)
    assert got and not isinstance(got[0], GatewayError), got
    assert got[0].text == "hi"


@pytest.mark.parametrize("model", ["cr", "crlf-cut"])
def test_every_line_end_the_sse_standard_allows(hostile, model):
    """CRLF, LF and a bare CR all end a line (the synchronous client's decoder, httpx's, agrees);
    a CRLF cut between chunks is one line end, not two (an empty line would end the event early)."""
    reply = _stream(hostile.base_url, model, timeout=5.0)
    assert reply.text == "hi"


@pytest.mark.parametrize("synchronous", [False, True])
def test_unicode_line_separators_inside_an_event(hostile, synchronous):
    """U+2028, U+0085, U+2029 and a form feed inside an event's JSON end no line (httpx's
    ``iter_lines`` split there: the synchronous client read a non-JSON event and retried)."""
    seen: list[str] = []
    request = ModelRequest(model="separators", input=[])
    if synchronous:
        reply = SyncModelClient(RESPONSES, hostile.base_url, timeout=5.0).stream(request, lambda d: seen.append(d.text))
    else:
        reply = _stream(hostile.base_url, "separators", lambda d: seen.append(d.text), timeout=5.0)
    assert reply.text == SEPARATORS and seen == [SEPARATORS]


def test_a_50_mb_event_arrives_whole(hostile):
    reply = _stream(hostile.base_url, "huge", timeout=30.0)
    assert reply.text == "hi"


@pytest.mark.parametrize(
    ("model", "says"), [("utf8", "non-JSON event"), ("nonjson", "non-JSON body"), ("reset-mid", "model stream broke")]
)
def test_garbage_and_resets_are_retryable_gateway_errors(hostile, model, says):
    with pytest.raises(GatewayError) as bad:
        _stream(hostile.base_url, model, timeout=5.0)
    assert bad.value.retryable and says in str(bad.value)


# ----- behind real workers ------------------------------------------------------------------------
SCRIPTS = ScriptedGateway({"ok": [{"output": [fc("read_thing", {"label": "x"})]}, {"output": [msg("done")]}]})


async def answer(body: dict[str, Any], writer: Writer, n: int) -> None:
    """The scripted two-step turn (a tool call, then "done"), as a whole JSON body."""
    status, payload = SCRIPTS.respond({**body, "model": "ok"})
    await send_json(writer, status, payload)


def failing_first(status: int, times: int, then: Behaviour = answer) -> Behaviour:
    async def behave(body: dict[str, Any], writer: Writer, n: int) -> None:
        if n < times:
            await send_json(
                writer, status, {"error": {"message": f"error {status} number {n}", "type": "server_error"}}
            )
        else:
            await then(body, writer, n)

    return behave


def slow(seconds: float, first_only: bool = False) -> Behaviour:
    async def behave(body: dict[str, Any], writer: Writer, n: int) -> None:
        if n == 0 or not first_only:
            await asyncio.sleep(seconds)
        await answer(body, writer, n)

    return behave


def per_turn_slow(seconds: float, gate: set[str]) -> Behaviour:
    """Slow the first call of each agent (``metadata`` is not sent; the user input names it)."""

    async def behave(body: dict[str, Any], writer: Writer, n: int) -> None:
        key = orjson.dumps(body.get("input", [])[:1]).decode()
        if key not in gate:
            gate.add(key)
            await asyncio.sleep(seconds)
        await answer(body, writer, n)

    return behave


async def completed_then_silent_json(body: dict[str, Any], writer: Writer, n: int) -> None:
    """The scripted answer as a stream whose terminal event is followed by silence."""
    _, payload = SCRIPTS.respond({**body, "model": "ok"})
    writer.write(SSE_HEAD + event({"type": "response.completed", "response": payload}))
    await writer.drain()
    await asyncio.sleep(3600)


@pytest.fixture
def served():
    server = Hostile({})
    yield server
    server.stop()


@pytest.fixture
def stack(served):
    s = PrivateStack(OPENAI_BASE_URL=served.base_url, OPENAI_API_STYLE="responses", AGENT_PROGRESS_SLACK="900")
    yield s
    s.close()


def _turn(stack: PrivateStack, model: str, agent: str = "a") -> str:
    return stack.control.enqueue({"agent_id": agent, "input": f"go {agent}", "model": model, "toolset": "testing"})


def _called(served: Hostile, model: str, timeout: float = 30) -> None:
    """Wait until ``model`` has been called once (its call in flight)."""
    deadline = time.monotonic() + timeout
    while served.calls[model] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _kinds(stack: PrivateStack, tid: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in stack.control.events(tid) if e.get("kind") == kind]


def test_http_500_twice_then_success_is_retried_and_paid_once(stack, served):
    served.behaviours["m"] = failing_first(500, 2)
    stack.start_worker(concurrency=2)
    tid = _turn(stack, "m")
    view = stack.control.wait(tid, timeout=90)
    assert view.status.value == "completed" and view.final_output == "done", view
    assert served.calls["m"] == 4  # two failures, then the two steps
    assert len(_kinds(stack, tid, "model_retry")) == 2
    assert len(_kinds(stack, tid, "model_reply")) == 2
    assert stack.control.usage(tid)["total"]["model_calls"] == 2


def test_http_429_forever_fails_the_turn_after_the_retries(stack, served):
    served.behaviours["m"] = failing_first(429, 10**9)
    stack.start_worker(concurrency=2)
    tid = _turn(stack, "m")
    view = stack.control.wait(tid, timeout=120)
    assert view.status.value == "failed", view
    assert "after retries" in (view.error or "") and "429" in (view.error or ""), view.error
    assert served.calls["m"] == 6  # the call and its 5 retries
    assert len(_kinds(stack, tid, "model_retry")) == 5


def test_a_reply_followed_by_an_open_stream_is_not_paid_again(stack, served):
    """The endpoint sends ``response.completed`` and keeps the stream open: the turn completes with
    one request per step (before the fix: a read timeout after the reply, a retry, a second payment)."""
    served.behaviours["m"] = completed_then_silent_json
    stack.start_worker(concurrency=2, env={"AGENT_MODEL_TIMEOUT": "3"})
    tid = _turn(stack, "m")
    view = stack.control.wait(tid, timeout=90)
    assert view.status.value == "completed" and view.final_output == "done", view
    assert served.calls["m"] == 2
    assert not _kinds(stack, tid, "model_retry")


def test_cancel_during_the_call_ends_the_turn_cancelled(stack, served):
    served.behaviours["m"] = slow(3.0)
    stack.start_worker(concurrency=2)
    tid = _turn(stack, "m")
    _called(served, "m")
    assert stack.control.cancel(tid)
    view = stack.control.wait(tid, timeout=30)
    assert view.status.value == "cancelled", view
    time.sleep(4)  # the late reply has arrived and been handled: it did not revive the turn
    assert stack.control.status(tid).status.value == "cancelled"
    assert served.calls["m"] == 1 and not _kinds(stack, tid, "call_started")


def generating(seconds: float, closed: list[float]) -> Behaviour:
    """A stream that keeps generating (a comment every 0.1 s) for ``seconds``; ``closed`` gets the
    time the client went, if it does."""

    async def behave(body: dict[str, Any], writer: Writer, n: int) -> None:
        writer.write(SSE_HEAD)
        until = time.monotonic() + seconds
        try:
            while time.monotonic() < until:
                writer.write(chunk(b": generating\n\n"))
                await writer.drain()
                if writer.transport.is_closing():
                    break
                await asyncio.sleep(0.1)
            else:
                return
        except (ConnectionError, OSError):
            pass
        closed.append(time.monotonic())

    return behave


def test_a_cancelled_turns_model_call_is_aborted_not_waited_for(stack, served):
    """A turn cancelled while its model call generates: the node's watch over its calls in flight
    aborts the call (the endpoint sees the connection go, as a provider that then stops billing)
    and the turn ends ``cancelled`` within the watch's poll, not when the minute-long call ends."""
    closed: list[float] = []
    served.behaviours["m"] = generating(60.0, closed)
    stack.start_worker(concurrency=2)
    tid = _turn(stack, "m")
    _called(served, "m")
    time.sleep(0.5)
    cancelled_at = time.monotonic()
    assert stack.control.cancel(tid)
    view = stack.control.wait(tid, timeout=30)
    assert view.status.value == "cancelled" and "during its model call" in (view.error or ""), view
    assert time.monotonic() - cancelled_at < 10
    deadline = time.monotonic() + 10
    while not closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed and closed[0] - cancelled_at < 10  # the connection went, long before the 60 s
    assert served.calls["m"] == 1 and not _kinds(stack, tid, "model_reply")


def test_a_worker_killed_mid_call_has_its_turn_finished_elsewhere(stack, served):
    served.behaviours["m"] = slow(30.0, first_only=True)
    worker = stack.start_worker(concurrency=2)
    tid = _turn(stack, "m")
    _called(served, "m")
    stack.kill(worker)
    stack.start_worker(concurrency=2)
    stack.start_beat()
    view = stack.control.wait(tid, timeout=90)
    assert view.status.value == "completed" and view.final_output == "done", view
    assert served.calls["m"] == 3  # the lost call, made again, and step 1
    assert len(_kinds(stack, tid, "model_reply")) == 2
    assert stack.control.usage(tid)["total"]["model_calls"] == 2


def test_warm_shutdown_with_several_calls_in_flight(stack, served):
    gate: set[str] = set()
    served.behaviours["m"] = per_turn_slow(30.0, gate)
    worker = stack.start_worker(concurrency=2, env={"AGENT_MODEL_DRAIN_TIMEOUT": "0.5"})
    tids = [_turn(stack, "m", f"sig-{i}") for i in range(8)]
    deadline = time.monotonic() + 60
    while served.calls["m"] < 8:
        assert time.monotonic() < deadline, served.calls
        time.sleep(0.05)
    os.killpg(worker.pid, signal.SIGTERM)
    worker.wait(20)  # raises if the shutdown waited for the calls
    stack.start_worker(concurrency=2)
    for tid in tids:
        view = stack.control.wait(tid, timeout=90)
        assert view.status.value == "completed" and view.final_output == "done", (tid, view)
        assert len(_kinds(stack, tid, "model_reply")) == 2
        assert stack.control.usage(tid)["total"]["model_calls"] == 2


def test_hundreds_of_turns_on_two_threads(stack, served):
    """300 turns (600 calls, 0.2 s each) on a threads pool of 2: all complete, none retried (a call
    stuck until its read timeout would show as a ``model_retry``)."""
    served.behaviours["m"] = slow(0.2)
    stack.start_worker(concurrency=2, env={"AGENT_MODEL_TIMEOUT": "60"})
    tids = [_turn(stack, "m", f"many-{i}") for i in range(300)]
    for tid in tids:
        view = stack.control.wait(tid, timeout=300)
        assert view.status.value == "completed", (tid, view)
    assert served.calls["m"] == 600
    assert not any(_kinds(stack, tid, "model_retry") for tid in tids)


def test_warm_shutdown_finishes_the_calls_that_answer_within_the_drain(stack, served):
    """SIGTERM with calls that answer in 2 s and the default drain (8 s): the shutdown waits for
    them, stores their replies and sends their tool calls on; another node finishes the turns,
    and no step is paid twice."""
    gate: set[str] = set()
    served.behaviours["m"] = per_turn_slow(2.0, gate)
    worker = stack.start_worker(concurrency=2)
    tids = [_turn(stack, "m", f"drain-{i}") for i in range(4)]
    deadline = time.monotonic() + 60
    while served.calls["m"] < 4:
        assert time.monotonic() < deadline, served.calls
        time.sleep(0.05)
    os.killpg(worker.pid, signal.SIGTERM)
    worker.wait(30)
    for tid in tids:  # each first reply was stored before the worker exited
        assert len(_kinds(stack, tid, "model_reply")) == 1, tid
    stack.start_worker(concurrency=2)
    for tid in tids:
        view = stack.control.wait(tid, timeout=90)
        assert view.status.value == "completed" and view.final_output == "done", (tid, view)
    assert served.calls["m"] == 8


def test_duplicates_during_a_call_on_a_threads_pool_do_not_pay_twice(stack, served):
    """Three more deliveries of a step whose call is in flight, on other threads of the pool: each
    sees the call as another's and drops it."""
    served.behaviours["m"] = slow(3.0, first_only=True)
    stack.start_worker(concurrency=4)
    tid = _turn(stack, "m")
    _called(served, "m")
    for _ in range(3):
        stack.control._engine.dispatcher.enqueue_step(tid, 0, queue="turns")
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == "done", view
    assert served.calls["m"] == 2
    assert len(_kinds(stack, tid, "model_reply")) == 2


def test_cancel_during_a_retry_backoff(stack, served):
    """HTTP 503 forever, cancelled after the first ``model_retry``: the retried step ends the turn
    cancelled, without the four retries left."""
    served.behaviours["m"] = failing_first(503, 10**9)
    stack.start_worker(concurrency=2)
    tid = _turn(stack, "m")
    deadline = time.monotonic() + 30
    while not _kinds(stack, tid, "model_retry"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert stack.control.cancel(tid)
    view = stack.control.wait(tid, timeout=30)
    assert view.status.value == "cancelled", view
    assert served.calls["m"] <= 2  # not the 6 of a retry chain run out
