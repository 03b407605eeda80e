"""``python -m control.api [--host H] [--port P]`` (``make api``): serve the HTTP control plane.

Defaults from ``AGENT_API_HOST`` / ``AGENT_API_PORT`` (127.0.0.1:8700); Redis from
``CONTROL_REDIS_URL`` (else ``REDIS_URL``). One process, one event loop: run several behind a
load balancer to scale (each holds its own event streams; tokens and rate limits live in Redis).
"""

from __future__ import annotations

import argparse
import logging


def tune_process() -> None:
    """Python's collector tuned as in a worker (``tasks.app.tune_gc``: start-up objects frozen,
    generation 0 collected every 20,000 allocations instead of 700). Each open event stream keeps
    about 250 objects the collector walks: at 2,000 streams, CPython's default thresholds ran a
    full collection of half a million objects (100-400 ms with the event loop stopped) in every
    burst of events, which was the fan-out's p99 (bench/README.md, the HTTP edge)."""
    from tasks.app import tune_gc

    tune_gc()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from control.api.app import create_app
    from control.api.settings import ApiSettings

    settings = ApiSettings()
    parser = argparse.ArgumentParser(prog="python -m control.api", description=__doc__)
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    tune_process()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        # libuv's event loop and the C HTTP parser (both pinned dependencies): less CPU per request
        # and per event written than asyncio's selector loop and h11 (bench/README.md).
        loop="uvloop",
        http="httptools",
        proxy_headers=False,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
