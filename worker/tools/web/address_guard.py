"""Address checks for outbound fetches (SSRF guard).

The rule (OWASP SSRF prevention; cloud metadata endpoints per AWS/GCP/Azure
docs): a fetch may only reach globally routable unicast addresses. The deny
list is explicit (``SPECIAL_PURPOSE_V4`` / ``SPECIAL_PURPOSE_V6``): every block
of the IANA IPv4 and IPv6 Special-Purpose Address Registries, plus multicast,
IPv6 site-local and everything outside IPv6 global unicast ``2000::/3``;
Python's ``ipaddress`` flags stay as a last net only (they miss ``fec0::/10``,
``192.0.0.8`` and ``192.88.99.0/24``: docs/isolation.md, "Web"). The cloud metadata addresses
``169.254.169.254``, ``fd00:ec2::254`` and ``100.100.100.200`` get their own
reason. IPv4 embedded in IPv6 (mapped ``::ffff:0:0/96``, NAT64 ``64:ff9b::/96``,
6to4 ``2002::/16``) is judged by the embedded IPv4 address; Teredo
(``2001::/32``) is refused as part of ``2001::/23``.

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
from typing import Any, Iterable, Iterator, NoReturn

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Sources: IANA IPv4 Special-Purpose Address Registry
# (https://www.iana.org/assignments/iana-ipv4-special-registry/, RFC 6890 and later updates),
# IANA IPv4 Multicast Address Space Registry (224.0.0.0/4). Every block is refused, also the
# few the registry marks globally reachable (AS112, AMT, PCP/TURN anycast): no page lives there.
# More specific blocks come first so the reason names them.
SPECIAL_PURPOSE_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), reason)
    for net, reason in (
        ("0.0.0.0/8", "an unspecified (this network) address"),  # RFC 791, 0.0.0.0/32 included
        ("10.0.0.0/8", "a private address"),  # RFC 1918
        ("100.64.0.0/10", "a carrier-grade NAT (shared) address"),  # RFC 6598
        ("127.0.0.0/8", "a loopback address"),  # RFC 1122
        ("169.254.0.0/16", "a link-local address"),  # RFC 3927
        ("172.16.0.0/12", "a private address"),  # RFC 1918
        (
            "192.0.0.0/24",
            "an IETF protocol assignment (192.0.0.0/24)",
        ),  # RFC 6890: DS-Lite, 192.0.0.8 dummy, NAT64 discovery...
        ("192.0.2.0/24", "a documentation address (TEST-NET-1)"),  # RFC 5737
        ("192.31.196.0/24", "an AS112 address"),  # RFC 7535
        ("192.52.193.0/24", "an AMT address"),  # RFC 7450
        ("192.88.99.0/24", "a deprecated 6to4 relay anycast address"),  # RFC 7526
        ("192.168.0.0/16", "a private address"),  # RFC 1918
        ("192.175.48.0/24", "an AS112 direct delegation address"),  # RFC 7534
        ("198.18.0.0/15", "a benchmarking address"),  # RFC 2544
        ("198.51.100.0/24", "a documentation address (TEST-NET-2)"),  # RFC 5737
        ("203.0.113.0/24", "a documentation address (TEST-NET-3)"),  # RFC 5737
        ("224.0.0.0/4", "a multicast address"),  # RFC 5771
        ("255.255.255.255/32", "the limited broadcast address"),  # RFC 919
        ("240.0.0.0/4", "a reserved address"),  # RFC 1112
    )
)

# Sources: IANA IPv6 Special-Purpose Address Registry
# (https://www.iana.org/assignments/iana-ipv6-special-registry/), IANA IPv6 Address Space
# (fec0::/10 deprecated site-local, RFC 3879; ff00::/8 multicast, RFC 4291). The blocks that
# embed an IPv4 address (::ffff:0:0/96, 64:ff9b::/96, 2002::/16) are judged by that address
# before this table is read.
SPECIAL_PURPOSE_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), reason)
    for net, reason in (
        ("::/128", "an unspecified address"),  # RFC 4291
        ("::1/128", "a loopback address"),  # RFC 4291
        ("::/96", "a deprecated IPv4-compatible address"),  # RFC 4291
        ("64:ff9b:1::/48", "a local-use IPv4/IPv6 translation address"),  # RFC 8215
        ("100::/64", "a discard-only address"),  # RFC 6666
        ("100:0:0:1::/64", "a dummy IPv6 prefix address"),  # RFC 9780
        ("2001::/32", "a Teredo address"),  # RFC 4380
        ("2001::/23", "an IETF protocol assignment (2001::/23)"),  # RFC 2928: PCP, TURN, benchmarking, AMT, ORCHID...
        ("2001:db8::/32", "a documentation address"),  # RFC 3849
        ("2620:4f:8000::/48", "an AS112 direct delegation address"),  # RFC 7534
        ("3fff::/20", "a documentation address"),  # RFC 9637
        ("5f00::/16", "a segment routing (SRv6) SID address"),  # RFC 9602
        ("fc00::/7", "a private (unique local) address"),  # RFC 4193
        ("fe80::/10", "a link-local address"),  # RFC 4291
        ("fec0::/10", "a deprecated site-local address"),  # RFC 3879
        ("ff00::/8", "a multicast address"),  # RFC 4291
    )
)
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")  # RFC 4291: the only global unicast space allocated


class BlockedAddressError(ValueError):
    """A fetch target that resolves to an address the guard refuses. The message names host, address and reason."""


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside a mapped, NAT64 (well-known prefix) or 6to4 IPv6 address."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr.sixtofour


def block_reason(ip: str | IPAddress, *, allow_loopback: bool = False) -> str | None:
    """Why ``ip`` may not be fetched, or ``None`` when it may.

    Reasons are short phrases ("a private address", "the cloud metadata
    address"...). Raises ``ValueError`` for a string that is not an IP address.
    """
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            return "a scoped IPv6 address"
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            inner = block_reason(embedded, allow_loopback=allow_loopback)
            return f"{inner} (embedded in IPv6)" if inner else None
    if addr in METADATA_ADDRESSES:
        return "the cloud metadata address"
    if addr.is_loopback and allow_loopback:
        return None
    table = SPECIAL_PURPOSE_V6 if isinstance(addr, ipaddress.IPv6Address) else SPECIAL_PURPOSE_V4
    for net, reason in table:
        if addr in net:
            return reason
    if isinstance(addr, ipaddress.IPv6Address) and addr not in GLOBAL_UNICAST_V6:
        return "not a global unicast address (outside 2000::/3)"
    # Last net: Python's tables (a newer interpreter may know a block this list does not).
    if addr.is_private or addr.is_reserved or addr.is_link_local or addr.is_multicast or not addr.is_global:
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

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> _TrackedStream:
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

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> NoReturn:
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

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._resp.stream  # type: ignore[misc]
        except httpcore.TimeoutException as exc:
            raise httpx.ReadTimeout(str(exc)) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise httpx.ReadError(str(exc)) from exc

    def close(self) -> None:
        self._resp.close()
