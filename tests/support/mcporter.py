"""Install the pinned mcporter CLI into ``<project>/var/node`` for tests (no skip: CI installs it).

mcporter 0.9.0 is the newest release whose ``engines`` accepts Node 20
(0.10+ require Node >= 24).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

MCPORTER_VERSION = "0.9.0"
PROJECT = Path(__file__).resolve().parents[2]
NODE_PREFIX = PROJECT / "var" / "node"
BIN_DIR = NODE_PREFIX / "node_modules" / ".bin"


def installed_version() -> str | None:
    """The mcporter version under ``var/node``, or None."""
    exe = BIN_DIR / "mcporter"
    if not exe.exists():
        return None
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None


def ensure_mcporter() -> Path:
    """Return the bin directory holding ``mcporter``, installing the pinned version with npm if needed.

    Raises ``RuntimeError`` (with npm's output) if npm is missing or the install fails.
    """
    if installed_version() == MCPORTER_VERSION:
        return BIN_DIR
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is required to install mcporter for the MCP skill test")
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [npm, "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund", f"mcporter@{MCPORTER_VERSION}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or installed_version() != MCPORTER_VERSION:
        raise RuntimeError(f"npm install mcporter@{MCPORTER_VERSION} failed:\n{proc.stdout}\n{proc.stderr}")
    return BIN_DIR
