"""A local web server for the web tool tests: a SearXNG-compatible search endpoint and pages.

- ``GET /search?q=...&format=json`` -> ``{"results": [{"title", "url", "content"}]}``
- ``GET /article`` -> an HTML article
- ``GET /to-metadata`` -> 302 to http://169.254.169.254/latest/meta-data/ (must be refused before connecting)
- ``GET /gzip-bomb`` -> ``Content-Encoding: gzip, gzip``: about 1 KB on the wire, 600 MB decoded
- ``GET /gzip-twice`` -> the article, ``Content-Encoding: gzip, gzip``
- ``GET /brotli`` -> ``Content-Encoding: br`` (not supported by the fetch tool)
"""

from __future__ import annotations

import functools
import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import orjson

ARTICLE = """<html><head><title>Celery barriers</title></head><body><nav>menu</nav>
<article><h1>Celery barriers</h1><p>A barrier of your own, kept in a Redis hash keyed by call_id,
avoids the chord hazards of the Redis result backend.</p><p>Fencing drops stale step messages.</p></article>
<footer>footer</footer></body></html>"""


BOMB_DECODED_BYTES = 600 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """gzip(gzip(600 MB of zeros)): about 1 KB. Built once, streaming (never 600 MB in memory)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1024 * 1024)
    inner = b"".join(c.compress(block) for _ in range(BOMB_DECODED_BYTES // len(block))) + c.flush()
    return gzip.compress(inner, 9)


class WebServer:
    def __init__(self) -> None:
        self.queries: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                parts = urlsplit(self.path)
                if parts.path == "/search":
                    q = parse_qs(parts.query)
                    server.queries.append({"q": q.get("q", [""])[0], "auth": self.headers.get("Authorization")})
                    body = orjson.dumps(
                        {
                            "results": [
                                {
                                    "title": f"Result {i} for {q.get('q', [''])[0]}",
                                    "url": f"https://example.org/{i}",
                                    "content": f"snippet {i}",
                                }
                                for i in range(3)
                            ]
                        }
                    )
                    self._send(200, body, "application/json")
                elif parts.path == "/article":
                    self._send(200, ARTICLE.encode(), "text/html; charset=utf-8")
                elif parts.path == "/gzip-bomb":
                    self._send(200, gzip_bomb(), "text/plain", {"Content-Encoding": "gzip, gzip"})
                elif parts.path == "/gzip-twice":
                    body = gzip.compress(gzip.compress(ARTICLE.encode()))
                    self._send(200, body, "text/html; charset=utf-8", {"Content-Encoding": "gzip, gzip"})
                elif parts.path == "/brotli":
                    self._send(200, b"\x0b\x02\x80hello\x03", "text/plain", {"Content-Encoding": "br"})
                elif parts.path == "/to-metadata":
                    self.send_response(302)
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, status, body, ctype, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
