"""``devtools.ports.free_port``: ports a server binds later come from below the kernel's ephemeral
range, where no outgoing connection takes its local port (the flaky "Address already in use" of
``make stack``'s metrics and of the node-metrics test came from ports inside it)."""

from __future__ import annotations

import socket

import pytest

from devtools import ports


def test_a_picked_run_of_ports_is_free_and_below_the_ephemeral_range():
    low = ports.ephemeral_low()
    for count in (1, 2, 3):
        port = ports.free_port(count)
        assert ports.LOWEST <= port and port + count - 1 < low
        socks = [socket.socket() for _ in range(count)]
        try:
            for i, sock in enumerate(socks):
                sock.bind(("127.0.0.1", port + i))  # raises if one was taken
        finally:
            for sock in socks:
                sock.close()


def test_an_outgoing_connection_never_takes_a_picked_port():
    """What the flaky tests hit: client sockets take their local port from the ephemeral range."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            locals_ = {c.getsockname()[1] for c in clients}
            assert all(p >= ports.ephemeral_low() for p in locals_)
            picked = {ports.free_port() for _ in range(50)}
            assert not picked & locals_
        finally:
            for c in clients:
                c.close()


def test_a_taken_port_is_never_returned(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        held = taken.getsockname()[1]
        # Force the only candidates to be the held port's neighbourhood: low = held + 2, LOWEST = held.
        monkeypatch.setattr(ports, "LOWEST", held - 1)
        monkeypatch.setattr(ports, "ephemeral_low", lambda: held + 2)
        # candidates: held - 1 (free unless something else holds it) and held (taken)
        for _ in range(20):
            try:
                assert ports.free_port() != held
            except RuntimeError:
                pass  # held - 1 happened to be taken too: nothing free, which is the right answer


def test_no_room_below_the_range_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: ports.LOWEST + 1)
    with pytest.raises(RuntimeError, match="no room below it"):
        ports.free_port(2)
