"""The real-model tier (``make test-real-model``; left out of ``make test``,
tests/conftest.py): llama.cpp's server with a small open model (``devtools.real_model``) in place
of the scripted gateway, and a private stack per wire style whose worker points at it.

Nothing is mocked: the server, Redis and the Celery worker are real processes. A missing
prerequisite (cmake, a compiler, PyPI) fails the tier; a prepared cache (``make real-model``)
makes its start a few seconds.
"""

from __future__ import annotations

import pytest

from devtools.real_model import MODEL_NAME, LlamaServer, model_file, server_binary, tool_template
from tests.conftest import API_STYLES
from tests.support.private_stack import PrivateStack


@pytest.fixture(scope="session")
def llama_server():
    """One ``llama-server`` for the session (one slot: the tier's turns run one at a time)."""
    binary, model = server_binary(), model_file()
    server = LlamaServer(binary, model, tool_template(binary, model))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=API_STYLES)
def real_stack(request, llama_server):
    """A private stack (its own Redis, one ``--pool solo -c 1`` worker) speaking
    ``OPENAI_API_STYLE=request.param`` to ``llama_server``; ``real_stack.style`` names the style."""
    with pytest.MonkeyPatch.context() as env:
        # The control plane (made in this process) checks a turn's toolset against the same list.
        env.setenv(
            "AGENT_EXTRA_TOOLSETS",
            "weather=tests.integration.real_model.toolset:weather_tools,plain=tests.integration.real_model.toolset:no_tools",
        )
        stack = PrivateStack(
            OPENAI_API_STYLE=request.param,
            OPENAI_BASE_URL=llama_server.base_url,
            OPENAI_MODEL=MODEL_NAME,
            AGENT_MAX_MODEL_CALLS="4",
            AGENT_MODEL_TIMEOUT="300",  # a loaded 2-core machine generates slowly
        )
        stack.style = request.param
        try:
            stack.start_worker(pool="solo", concurrency=1)
            yield stack
        finally:
            stack.close()


CATALOG_DEFERRED = "*,!run_command,!read_file,!write_file"
"""``AGENT_DEFER_TOOLS`` of ``catalog_stack``: the text catalog with every tool but the three its
turns need deferred behind ``tool_search`` (docs/real-model.md, "Deferred tools and prompt size")."""


@pytest.fixture(scope="module", params=API_STYLES)
def catalog_stack(request, llama_server):
    """A private stack like ``real_stack`` for turns of the product's own text catalog, with
    ``CATALOG_DEFERRED`` deferred; ``catalog_stack.style`` names the style."""
    stack = PrivateStack(
        OPENAI_API_STYLE=request.param,
        OPENAI_BASE_URL=llama_server.base_url,
        OPENAI_MODEL=MODEL_NAME,
        AGENT_DEFER_TOOLS=CATALOG_DEFERRED,
        AGENT_MAX_MODEL_CALLS="6",
        AGENT_MODEL_TIMEOUT="300",
    )
    stack.style = request.param
    try:
        stack.start_worker(pool="solo", concurrency=1)
        yield stack
    finally:
        stack.close()
