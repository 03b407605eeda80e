"""One keep-alive ``httpx.Client`` per thread, for the model clients (Responses and Chat Completions).

httpcore's sync connection pool, shared by hundreds of threads, closes connections that another
thread was handed and is about to use or already uses (surplus keep-alive, keep-alive expiry;
encode/httpcore#1110): that thread either fails with ``EBADF`` or waits in a ``poll()`` that
nothing wakes until its read timeout. With one pool per thread, a pool's clean-up only ever
closes its own thread's idle connections (bench/README.md, "Keep-alive endpoint and the hung
model call"). Every thread's client shares one TLS context: loading the CA bundle costs about
10 ms, once per process.
"""

from __future__ import annotations

import ssl
import threading

import certifi
import httpx


class ThreadClients:
    """``get()``: this thread's ``httpx.Client`` with ``base_url``, ``headers``, ``timeout`` and
    ``limits`` (per thread); ``transport``, when given, is shared by every thread's client (tests).
    ``close()`` closes every thread's connections."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout: httpx.Timeout,
        limits: httpx.Limits,
        transport: httpx.BaseTransport | None = None,
    ):
        self._base_url = base_url
        self._headers = headers
        self._timeout = timeout
        self._limits = limits
        self._transport = transport
        self._tls: ssl.SSLContext | None = None
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        """This thread's client, made on its first call."""
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                if self._tls is None:
                    self._tls = ssl.create_default_context(cafile=certifi.where())
                client = httpx.Client(
                    base_url=self._base_url,
                    headers=self._headers,
                    timeout=self._timeout,
                    limits=self._limits,
                    transport=self._transport,
                    verify=self._tls,
                )
                self._clients.append(client)
            self._local.client = client
        return client

    def close(self) -> None:
        """Close every thread's pooled connections (a thread's next ``get()`` makes a new client)."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()
