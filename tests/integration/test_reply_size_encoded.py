"""The synchronous clients' cap (``AGENT_MODEL_MAX_REPLY_BYTES``) holds for a compressed answer
too: httpx decodes each 64 KiB read whole, and deflate expands up to ~1000x, so a small gzip body
put ~66 MB per read in memory before any count saw it, whatever the cap. Bodies are decoded here in
bounded pieces. A compressed answer below the cap still reads as before, whole or streamed."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import tracemalloc
import zlib

import pytest

from tests.support.loopback import LoopbackServer
from worker.model.chat import CHAT
from worker.model.interface import GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient

CLIENTS = {
    "responses": lambda url, cap: SyncModelClient(RESPONSES, url, max_reply_bytes=cap, timeout=10),
    "chat": lambda url, cap: SyncModelClient(CHAT, url, max_reply_bytes=cap, timeout=10),
}
REQUEST = ModelRequest(model="m", input=[{"role": "user", "content": "hi"}])


class _Server(LoopbackServer):
    """Answers each request on a connection with ``answer`` (keep-alive)."""

    def __init__(self, answer: bytes):
        self.answer = answer
        super().__init__(self._answer)

    def _answer(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                buf = rest[length:]
                conn.sendall(self.answer)
        except OSError:
            pass
        finally:
            conn.close()


def _chunked_answer(content_type: bytes, encoding: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 16384]), body[i : i + 16384]) for i in range(0, len(body), 16384)
    )
    return head % (content_type, encoding) + chunks + b"0\r\n\r\n"


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, 9)


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data, 9)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_compressed_answer_far_above_the_cap_is_cut_without_decoding_it_whole(kind, streamed):
    ctype = b"text/event-stream" if streamed else b"application/json"
    bomb = _gzip(b"\0" * 200_000_000)  # ~200 KB on the wire
    server = _Server(_chunked_answer(ctype, b"gzip", bomb))
    client = CLIENTS[kind](server.base_url, 65_536)
    tracemalloc.start()
    try:
        with pytest.raises(GatewayError) as too_big:
            client.stream(REQUEST, lambda d: None) if streamed else client.create(REQUEST)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        client.close()
        server.stop()
    assert not too_big.value.retryable and "AGENT_MODEL_MAX_REPLY_BYTES" in str(too_big.value)
    assert peak < 8_000_000, f"{peak} bytes held for a 64 KiB cap"


RESPONSE = (
    b'{"id":"r1","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"%s"}]}]}'
)
CHAT_RESPONSE = (
    b'{"id":"c1","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"%s"}}]}'
)
EVENTS = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"%s"}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":%s}\n\n'
)
CHAT_EVENTS = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_compressed_answer_below_the_cap_reads_as_before(kind, streamed, encoding):
    text = b"z" * 300_000
    if streamed:
        body = EVENTS % (text, RESPONSE % text) if kind == "responses" else CHAT_EVENTS % text
    else:
        body = (RESPONSE if kind == "responses" else CHAT_RESPONSE) % text
    packed = (_gzip if encoding == b"gzip" else _deflate)(body)
    server = _Server(_chunked_answer(b"text/event-stream" if streamed else b"application/json", encoding, packed))
    client = CLIENTS[kind](server.base_url, 2_000_000)
    try:
        for _ in range(2):  # the connection goes back to the pool clean
            reply = client.stream(REQUEST, lambda d: None) if streamed else client.create(REQUEST)
            assert reply.text == text.decode()
    finally:
        client.close()
        server.stop()


def test_a_tail_that_trickles_bytes_without_a_line_end_is_left_after_the_tail_wait():
    """After the terminal event the synchronous client reads the rest for ``TAIL_WAIT`` s at most
    (``wire_format._read_tail``), also when the rest never completes a line: the clock was looked
    at only per line, so a byte now and then held the call (and its worker thread) until the cap
    or the read timeout."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = EVENTS % (b"hi", RESPONSE % b"hi")
    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = sock.accept()
        try:
            conn.recv(65536)
            conn.sendall(head + b"%x\r\n%s\r\n" % (len(events), events))
            for _ in range(150):  # 15 s of one byte each 0.1 s, no line end
                if stop.wait(0.1):
                    break
                conn.sendall(b"1\r\nx\r\n")
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    client = SyncModelClient(RESPONSES, f"http://127.0.0.1:{sock.getsockname()[1]}/v1", timeout=10)
    try:
        started = time.monotonic()
        assert client.stream(REQUEST, lambda d: None).text == "hi"
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        client.close()
        sock.close()
