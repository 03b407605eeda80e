"""``make deploy-check-hosts`` refuses at once a checkout its namespace machines cannot see."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.hosts_check import check_visible
from devtools.machines import MachineError


@pytest.mark.parametrize("path", ["/tmp/newuser", "/srv/agent/checkout/.venv/bin/python"])
def test_a_checkout_under_a_machines_private_folder_is_refused(path):
    with pytest.raises(MachineError, match=r"which each machine mounts a filesystem of its own over"):
        check_visible(Path("/work/elsewhere"), Path(path))


def test_a_checkout_elsewhere_passes():
    check_visible(Path("/work/elsewhere"), Path("/opt/py/bin/python"))  # raises nothing
