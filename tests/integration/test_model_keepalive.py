"""The model client under hundreds of threads against a keep-alive endpoint, as a hosted API is.

httpcore's sync connection pool, shared by hundreds of threads, closes connections that another
thread has been handed or is already using (surplus keep-alive and keep-alive expiry passes;
encode/httpcore#1110): that thread fails with EBADF, or sits in a poll() nothing wakes until its
read timeout (a 120 s stall of one turn in the concurrency bench). The client keeps one pool per
thread, so no pool ever serves two threads. These tests go through ``SyncModelClient.create`` and
the streaming path (``SyncModelClient.stream``) against ``devtools.hosted_endpoint`` (HTTP/1.1,
keep-alive, chunked streams), with a short read timeout.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from devtools.hosted_endpoint import HostedEndpoint
from devtools.scripted_gateway import ScriptedGateway
from worker.model.chat import CHAT
from worker.model.interface import GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient

THREADS = 256  # the steps worker's threads pool
READ_TIMEOUT = 3.0


def _hammer(client: SyncModelClient, *, rounds: int, pause: tuple[float, float]) -> tuple[int, list[tuple[float, str]]]:
    """Every thread makes ``rounds`` calls, JSON and streamed in turn, pausing ``pause`` seconds
    (uniform) between them. Returns (calls answered, [(seconds, error) of the others])."""
    done, bad, lock = [0], [], threading.Lock()
    start = threading.Barrier(THREADS)

    def work(i: int) -> None:
        request = ModelRequest(
            model="ka",
            input=[{"type": "message", "role": "user", "content": f"hello {i}"}],
            metadata={"client": str(threading.get_ident())},
        )
        start.wait()
        for j in range(rounds):
            t0 = time.monotonic()
            try:
                if (i + j) % 2:
                    reply = client.create(request)
                else:
                    reply = client.stream(request, lambda _: None)
                assert reply.text.startswith("kept alive")
                with lock:
                    done[0] += 1
            except GatewayError as exc:
                with lock:
                    bad.append((round(time.monotonic() - t0, 2), str(exc)[:120]))
            time.sleep(random.uniform(*pause))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return done[0], bad


def _endpoint(**kw: float) -> HostedEndpoint:
    gateway = ScriptedGateway({"ka": [{"output": [{"type": "message", "text": "kept alive " * 30}]}]})
    return HostedEndpoint(gateway, **kw).start()


@pytest.mark.parametrize("wire", [RESPONSES, CHAT], ids=["responses", "chat"])
def test_each_thread_has_its_own_pool_in_both_wire_apis(wire):
    """The model client takes its connections from worker.model.http_pool in every wire API: one
    client per thread."""
    client = SyncModelClient(wire, "http://127.0.0.1:9/v1", "k")
    seen: dict[int, list[object]] = {}
    together = threading.Barrier(8)  # all alive at once: no thread id is reused

    def grab() -> None:
        pool = client._http.pool
        seen[threading.get_ident()] = [pool.get(), pool.get()]
        together.wait()

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    assert all(a is b for a, b in seen.values())  # one client within a thread
    assert len({id(a) for a, _ in seen.values()}) == 8  # none shared between threads


def test_no_connection_serves_two_threads_and_no_call_waits_for_its_timeout():
    # Rounds straddle httpx's 5 s keep-alive expiry, where the shared pool's clean-up pass closes
    # connections other threads were just handed.
    endpoint = _endpoint(latency=0.05)
    client = SyncModelClient(RESPONSES, endpoint.base_url, "k", timeout=READ_TIMEOUT, connect_timeout=READ_TIMEOUT)
    try:
        done, bad = _hammer(client, rounds=4, pause=(1.0, 2.2))
    finally:
        client.close()
        endpoint.stop()
    assert not bad, f"{len(bad)} of {THREADS * 4} calls failed or waited for the read timeout: {bad[:5]}"
    assert done == THREADS * 4
    shared = {n: c for n, c in endpoint.clients_by_connection.items() if len(c) > 1}
    assert not shared, f"{len(shared)} connections carried requests of several threads (one pool shared by all)"
    # Keep-alive works, streamed calls included: far fewer connections than calls.
    assert endpoint.connections <= THREADS * 2, endpoint.connections


def test_connections_the_server_closed_while_idle_do_not_fail_calls():
    # A hosted API closes idle keep-alive connections after a while; a thread's next call must
    # open a new one instead of failing or hanging on the closed one.
    # The pause leaves 0.7 s or more between the server's close and the next call, so every reused
    # connection was closed before it is picked (a close racing the request itself is another case:
    # seen here at load average 10 with only 0.1 s between them).
    endpoint = _endpoint(latency=0.02, idle_timeout=0.3)
    client = SyncModelClient(RESPONSES, endpoint.base_url, "k", timeout=READ_TIMEOUT, connect_timeout=READ_TIMEOUT)
    try:
        done, bad = _hammer(client, rounds=3, pause=(1.0, 1.5))
    finally:
        client.close()
        endpoint.stop()
    assert not bad, f"{len(bad)} calls failed: {bad[:5]}"
    assert done == THREADS * 3
