"""The egress proxy of a sandboxed command whose turn allows network egress.

A sandbox always has its own, empty network namespace (only ``lo``). With
egress allowed, the worker serves a proxy on a unix socket in a private
directory; the socket is bind-mounted into the sandbox at ``SOCKET_IN_SANDBOX``
and a tiny relay (``RELAY``, run with the sandbox's Python) listens on
``127.0.0.1:PROXY_PORT`` inside and forwards each connection to it;
``HTTP_PROXY``/``HTTPS_PROXY`` point there. The proxy speaks HTTP ``CONNECT``
(any TCP, e.g. TLS) and plain absolute-form HTTP requests, and before
connecting applies the ``web_fetch`` address guard
(``worker.tools.web.address_guard.resolve_vetted``: no loopback, private,
link-local, CGNAT, multicast, reserved or metadata address, checked after DNS
and connected by vetted IP) plus the turn's optional host allowlist.
Refusals answer ``403`` with the reason. Redis and every internal service stay
unreachable: they are loopback/private addresses.

``Settings.test_only_egress_loopback_ports`` lets the proxy reach loopback
on the listed ports; it exists for the positive test against a local web
server and must never be set in production.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time
from urllib.parse import urlsplit

from worker.tools.web.address_guard import BlockedAddressError, resolve_vetted

log = logging.getLogger(__name__)

SOCKET_IN_SANDBOX = "/run/agent-egress.sock"
PROXY_PORT = 3128
HEAD_LIMIT = 64 * 1024
CONNECT_TIMEOUT = 10.0
# What one command may hold of the worker's resources through its proxy (the sandbox's limits do
# not count the worker's side): connections at once (each a thread and up to two descriptors; more
# are refused at once), and seconds to send a request head (a half-sent request is dropped).
MAX_CONNECTIONS = 32
HEAD_TIMEOUT = 10.0

# Runs inside the sandbox: python -I -S -c RELAY <unix socket> <port>. Prints "ready" once listening.
RELAY = r"""
import os, socket, sys, threading
path, port = sys.argv[1], int(sys.argv[2])
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(64)
sys.stdout.write("ready\n"); sys.stdout.flush(); os.close(1)
def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
while True:
    c, _ = srv.accept()
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        u.connect(path)
    except OSError:
        c.close(); u.close(); continue
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
"""


def host_allowed(host: str, allow_hosts: tuple[str, ...] | None) -> bool:
    """``allow_hosts`` ``None`` allows every host; else ``host`` must equal an entry, or end with
    an entry that starts with a dot (``.example.com`` allows ``a.example.com``). Case-insensitive."""
    if allow_hosts is None:
        return True
    host = host.lower().rstrip(".")
    for entry in allow_hosts:
        entry = entry.lower().rstrip(".")
        if host == entry.lstrip(".") or (entry.startswith(".") and host.endswith(entry)):
            return True
    return False


def _reply(conn: socket.socket, status: str, reason: str) -> None:
    body = f"egress proxy: {reason}\n".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    try:
        conn.sendall(head.encode() + body)
    except OSError:
        pass


class EgressProxy:
    """One command's egress proxy (a thread accepting on a fresh unix socket).

    ``socket_path`` is the host path to bind-mount; ``close()`` stops accepting,
    shuts down every relayed connection and removes the socket directory.
    """

    def __init__(
        self,
        allow_hosts: tuple[str, ...] | None = None,
        loopback_ports: frozenset[int] = frozenset(),
        owner: tuple[int, int] | None = None,
    ):
        """``owner``: the ``(uid, gid)`` the sandbox runs as, given the socket and its directory
        (bwrap binds the socket as that uid, and the relay connects as it)."""
        self.allow_hosts = allow_hosts
        self.loopback_ports = loopback_ports
        self._dir = tempfile.mkdtemp(prefix="agent-egress-")
        self.socket_path = os.path.join(self._dir, "egress.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.socket_path)
        if owner is not None:
            os.chown(self._dir, *owner)
            os.chown(self.socket_path, *owner)
        self._server.listen(64)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refusals: list[str] = []
        threading.Thread(target=self._accept, name="egress-proxy", daemon=True).start()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.update(socks)
            return True

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.1)  # out of descriptors for a moment: keep serving, never quit
                continue
            if not self._slots.acquire(blocking=False):
                self.refusals.append("too many connections")
                _reply(conn, "503 Service Unavailable", f"more than {MAX_CONNECTIONS} connections at once")
                conn.close()
                continue
            if not self._track(conn):
                self._slots.release()
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), name="egress-conn", daemon=True).start()

    def _vet(self, host: str, port: int) -> list[str]:
        if not host_allowed(host, self.allow_hosts):
            raise BlockedAddressError(f"host {host} is not in this turn's egress allowlist")
        return resolve_vetted(host, port, allow_loopback=port in self.loopback_ports)

    def _connect(self, addrs: list[str], port: int) -> socket.socket:
        last: OSError | None = None
        for ip in addrs:
            try:
                return socket.create_connection((ip, port), timeout=CONNECT_TIMEOUT)
            except OSError as exc:
                last = exc
        raise last or OSError("no address")

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(HEAD_TIMEOUT)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
                if len(head) > HEAD_LIMIT:
                    _reply(conn, "431 Request Header Fields Too Large", "request head too large")
                    return
            head, _, rest = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3:
                _reply(conn, "400 Bad Request", "malformed request line")
                return
            method, target, version = parts
            if method.upper() == "CONNECT":
                host, _, port_s = target.rpartition(":")
                host = host.strip("[]")
                first = b""
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    _reply(conn, "400 Bad Request", "only CONNECT and absolute http:// requests are proxied")
                    return
                host, port_s = url.hostname, str(url.port or 80)
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
                kept = [
                    h
                    for h in lines[1:]
                    if h.split(":", 1)[0].strip().lower()
                    not in ("proxy-connection", "proxy-authorization", "connection")
                ]
                first = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""]).encode(
                    "latin-1"
                )
            try:
                port = int(port_s)
                addrs = self._vet(host, port)
            except (ValueError, BlockedAddressError) as exc:
                reason = str(exc) if isinstance(exc, BlockedAddressError) else f"bad target {target!r}"
                self.refusals.append(reason)
                log.info("egress refused: %s", reason)
                _reply(conn, "403 Forbidden", reason)
                return
            try:
                upstream = self._connect(addrs, port)
            except OSError as exc:
                _reply(conn, "502 Bad Gateway", f"cannot connect to {host}:{port}: {exc}")
                return
            if not self._track(upstream):
                upstream.close()
                return
            upstream.settimeout(None)
            if method.upper() == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(first)
            if rest:
                upstream.sendall(rest)
            conn.settimeout(None)  # relayed traffic may idle; the selector waits, not recv
            self._splice(conn, upstream)
        except OSError:  # socket.timeout included: a request head that never came
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
            self._slots.release()

    def _splice(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        finally:
            sel.close()
            with self._lock:
                self._open.discard(b)
            b.close()

    def close(self) -> None:
        """Stop the proxy: no new connections, every open one shut down, the socket removed."""
        with self._lock:
            self._closed = True
            socks, self._open = list(self._open), set()
        for s in [self._server, *socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        shutil.rmtree(self._dir, ignore_errors=True)
