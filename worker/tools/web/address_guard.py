"""Address checks for outbound fetches (SSRF guard).

The rule (OWASP SSRF prevention; cloud metadata endpoints per AWS/GCP/Azure
docs): a fetch may only reach globally routable unicast addresses. Refused:
loopback, private (RFC 1918, ULA ``fc00::/7``), link-local (``169.254/16``,
``fe80::/10``), CGNAT (``100.64/10``), multicast, reserved, unspecified,
documentation/benchmark ranges, and the cloud metadata addresses
``169.254.169.254``, ``fd00:ec2::254`` and ``100.100.100.200`` (each also
falls in a refused range). IPv4 embedded in IPv6 (mapped ``::ffff:a.b.c.d``,
NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo) is judged by the
embedded IPv4 address.

The checks run *after* DNS resolution and at connect time:
``GuardedNetworkBackend`` resolves the host, refuses if *any* resolved address
is refused, and connects to the vetted IP itself, so a DNS answer that
changes between check and connect (rebinding) cannot swap the address. TLS
still uses the URL's host name for SNI and certificate checks (httpcore passes
it to ``start_tls``), and the ``Host`` header is the URL's.

``allow_loopback=True`` lets ``127.0.0.0/8`` and ``::1`` through (tests of
the happy path against local servers); everything else stays refused.

``GuardedTransport.cancel()`` (callable from another thread) shuts down every
socket the transport opened and refuses new connections: a watchdog uses it
to enforce one overall deadline on a fetch, which per-operation socket
timeouts cannot (a server trickling one header line at a time never trips a
read timeout).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any, Iterable

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))
CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class BlockedAddressError(ValueError):
    """A fetch target that resolves to an address the guard refuses. The message names host, address and reason."""


def block_reason(ip: str | IPAddress, *, allow_loopback: bool = False) -> str | None:
    """Why ``ip`` may not be fetched, or ``None`` when it may.

    Reasons are short phrases ("a private address", "the cloud metadata
    address"...). Raises ``ValueError`` for a string that is not an IP address.
    """
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            return "a scoped IPv6 address"
        embedded = addr.ipv4_mapped or addr.sixtofour
        if embedded is None and addr.teredo:
            embedded = addr.teredo[1]
        if embedded is None and addr in NAT64:
            embedded = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        if embedded is not None:
            inner = block_reason(embedded, allow_loopback=allow_loopback)
            return f"{inner} (embedded in IPv6)" if inner else None
    if addr in METADATA_ADDRESSES:
        return "the cloud metadata address"
    if addr.is_unspecified:
        return "an unspecified address"
    if addr.is_loopback:
        return None if allow_loopback else "a loopback address"
    if addr.is_link_local:
        return "a link-local address"
    if addr.is_multicast:
        return "a multicast address"
    if isinstance(addr, ipaddress.IPv4Address) and addr in CGNAT:
        return "a carrier-grade NAT (shared) address"
    if addr.is_private:
        return "a private address"
    if addr.is_reserved:
        return "a reserved address"
    if not addr.is_global:
        return "a non-global address"
    return None


def _literal_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve_vetted(host: str, port: int, *, allow_loopback: bool = False) -> list[str]:
    """Resolve ``host`` and return its addresses (strings) if every one is allowed.

    An IP literal is checked as is (no DNS). Raises ``BlockedAddressError``
    if the host does not resolve or if any resolved address is refused (a
    name that mixes public and private answers is refused as a whole).
    """
    literal = _literal_ip(host)
    if literal is not None:
        addrs = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise BlockedAddressError(f"cannot resolve host {host!r}: {exc}") from None
        addrs = []
        for info in infos:
            a = ipaddress.ip_address(info[4][0])
            if a not in addrs:
                addrs.append(a)
        if not addrs:
            raise BlockedAddressError(f"host {host!r} has no addresses")
    for a in addrs:
        reason = block_reason(a, allow_loopback=allow_loopback)
        if reason:
            shown = host if literal is not None else f"{host} ({a})"
            raise BlockedAddressError(f"refused to fetch {shown}: it is {reason}")
    return [str(a) for a in addrs]


class FetchCancelled(httpcore.ConnectError):
    """Raised for a connection attempted after ``GuardedNetworkBackend.cancel()``."""


class _TrackedStream(httpcore.NetworkStream):
    """A network stream the backend can shut down from another thread (TLS upgrades stay tracked)."""

    def __init__(self, inner: httpcore.NetworkStream, backend: "GuardedNetworkBackend"):
        self._inner = inner
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None):
        inner = self._inner.start_tls(ssl_context, server_hostname=server_hostname, timeout=timeout)
        return self._backend._track(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def shutdown(self) -> None:
        sock = self._inner.get_extra_info("socket")
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread
        except OSError:
            pass


class GuardedNetworkBackend(httpcore.SyncBackend):
    """An httpcore network backend that connects only to vetted addresses.

    ``connect_tcp`` resolves the host once, checks every address with
    ``block_reason`` and connects to the vetted IPs in order; no socket is
    opened for a refused host. Unix sockets are refused. ``cancel()`` shuts
    down every stream opened so far and makes later connects fail.
    """

    def __init__(self, *, allow_loopback: bool = False):
        super().__init__()
        self.allow_loopback = allow_loopback
        self._lock = threading.Lock()
        self._streams: list[_TrackedStream] = []
        self.cancelled = False

    def _track(self, inner: httpcore.NetworkStream) -> _TrackedStream:
        stream = _TrackedStream(inner, self)
        with self._lock:
            cancelled = self.cancelled
            if not cancelled:
                self._streams.append(stream)
        if cancelled:
            stream.shutdown()
            inner.close()
            raise FetchCancelled("the fetch was cancelled")
        return stream

    def cancel(self) -> None:
        """Shut down all streams (thread-safe); connections attempted afterwards fail."""
        with self._lock:
            self.cancelled = True
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.shutdown()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """Resolve ``host``, refuse it if any address is blocked, and connect to the vetted IPs in turn
        (no second lookup). Raises ``BlockedAddressError``, ``FetchCancelled`` or the last connect error."""
        if self.cancelled:
            raise FetchCancelled("the fetch was cancelled")
        addrs = resolve_vetted(host, port, allow_loopback=self.allow_loopback)
        last: Exception | None = None
        for ip in addrs:
            if self.cancelled:
                raise FetchCancelled("the fetch was cancelled")
            try:
                stream = super().connect_tcp(
                    ip, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except httpcore.ConnectError as exc:
                last = exc
                continue
            return self._track(stream)
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None):
        """Always refused: fetches never use local sockets."""
        raise BlockedAddressError("unix sockets are not allowed")


class GuardedTransport(httpx.BaseTransport):
    """An httpx transport over a connection pool that uses ``GuardedNetworkBackend``.

    No proxies (a proxy would connect on our behalf, past the guard), no
    environment settings (``trust_env`` off). Errors from httpcore are mapped
    to the matching ``httpx`` exceptions; ``BlockedAddressError`` passes through.
    """

    def __init__(self, *, allow_loopback: bool = False, verify: bool = True):
        ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False)
        self._backend = GuardedNetworkBackend(allow_loopback=allow_loopback)
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, max_connections=4, network_backend=self._backend)

    def cancel(self) -> None:
        """Abort everything in flight from any thread: sockets are shut down, new connects fail."""
        self._backend.cancel()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send the request through the guarded backend (the httpx transport interface)."""
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            resp = self._pool.handle_request(req)
        except BlockedAddressError:
            raise
        except httpcore.TimeoutException as exc:
            raise httpx.TimeoutException(str(exc), request=request) from exc
        except (httpcore.ConnectError, httpcore.NetworkError) as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except httpcore.ProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc
        return httpx.Response(
            status_code=resp.status, headers=resp.headers, stream=_Stream(resp), extensions=resp.extensions
        )

    def close(self) -> None:
        """Close the pool; cancels in-flight connections."""
        self._pool.close()


class _Stream(httpx.SyncByteStream):
    def __init__(self, resp: httpcore.Response):
        self._resp = resp

    def __iter__(self):
        try:
            yield from self._resp.stream  # type: ignore[misc]
        except httpcore.TimeoutException as exc:
            raise httpx.ReadTimeout(str(exc)) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise httpx.ReadError(str(exc)) from exc

    def close(self) -> None:
        self._resp.close()
