"""The unit tier: pure-Python tests, no service started.

Redis and the model gateway point at a closed port (``NO_SERVICE_URL``), so a unit test that
reaches for one fails loudly instead of passing or reaching a Redis of the machine; the service
fixtures (``redis_url``, ``gateway``, ``control``...) exist in ``tests/integration/conftest.py``
only, so a unit test that asks for one is an error. In a run of both tiers (``make test``) the
integration tier's environment stands, and these tests run in it too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.conftest import _state

NO_SERVICE_URL = "redis://127.0.0.1:1/0"  # a closed port


def pytest_configure(config):
    if _state.get("services"):
        return  # tests/integration/conftest.py already set the environment up (make test)
    homes = Path(tempfile.mkdtemp(prefix="agent-homes-"))
    os.environ.update(
        {
            "REDIS_URL": NO_SERVICE_URL,
            "CONTROL_REDIS_URL": NO_SERVICE_URL,
            "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
            "OPENAI_API_KEY": "sk-test-secret-never-logged",
            "OPENAI_MODEL": "unset-script",
            "AGENT_HOMES_ROOT": str(homes),
            "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:testing_tools",
            "AGENT_APPROVAL_MODE": "off",
        }
    )
    _state["homes"] = homes
