"""A raw loopback server for tests whose endpoint must misbehave below any HTTP library: a
listening socket on 127.0.0.1 whose every connection is handed to ``handle(conn)`` on a thread of
its own (which closes it)."""

from __future__ import annotations

import socket
import threading
from typing import Callable


class LoopbackServer:
    """``handle(conn)`` per connection; ``base_url`` (``http://127.0.0.1:<port>/v1``); ``stop()``
    closes the listening socket (``stopped`` is set for the handlers)."""

    def __init__(self, handle: Callable[[socket.socket], None]):
        self._handle = handle
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()
