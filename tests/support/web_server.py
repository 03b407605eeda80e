"""A local web server for the web tool tests: a SearXNG-compatible search endpoint and pages.

- ``GET /search?q=...&format=json`` -> ``{"results": [{"title", "url", "content"}]}``
- ``GET /article`` -> an HTML article
- ``GET /to-metadata`` -> 302 to http://169.254.169.254/latest/meta-data/ (must be refused before connecting)
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import orjson

ARTICLE = """<html><head><title>Celery barriers</title></head><body><nav>menu</nav>
<article><h1>Celery barriers</h1><p>A barrier of your own, kept in a Redis hash keyed by call_id,
avoids the chord hazards of the Redis result backend.</p><p>Fencing drops stale step messages.</p></article>
<footer>footer</footer></body></html>"""


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
                elif parts.path == "/to-metadata":
                    self.send_response(302)
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, status, body, ctype):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
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
