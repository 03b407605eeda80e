"""Agent homes on a node (worker/tools/computer/homes.py): the quota image, the agent's uid, release."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from worker.settings import Settings
from worker.tools.computer import homes


def test_a_home_is_its_own_quota_file_system_owned_by_the_agent(tmp_path):
    settings = Settings(home_quota_mb=32)
    home = tmp_path / "alice"
    ready = homes.provision(settings, home)
    assert os.path.ismount(home) and ready.quota_bytes == 32 * 1024**2
    options = next(line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == str(home))
    assert {"nosuid", "nodev"} <= set(options.split(","))
    st = home.stat()
    assert st.st_uid == ready.uid and settings.uid_base <= ready.uid < settings.uid_base + settings.uid_count
    assert st.st_mode & 0o777 == 0o700 and not list(home.iterdir())  # no lost+found shown to the agent
    assert homes.provision(settings, home) == ready  # idempotent
    homes.release(settings, home)
    assert not os.path.ismount(home)
    again = homes.provision(settings, home)  # the same image, the same uid
    assert again.uid == ready.uid and os.path.ismount(home)
    homes.release(settings, home, delete=True)
    assert not homes.image_path(settings, home).exists() and not home.exists()


def test_two_agents_never_share_a_uid_on_a_node(tmp_path):
    settings = Settings(home_quota_mb=0, uid_count=2)  # two uids: a hash collision is certain to be probed
    a = homes.provision(settings, tmp_path / "a")
    b = homes.provision(settings, tmp_path / "b")
    assert {a.uid, b.uid} == {settings.uid_base, settings.uid_base + 1}
    with pytest.raises(homes.HomeUnavailable, match="AGENT_UID_COUNT"):
        homes.provision(settings, tmp_path / "c")


def test_a_plain_home_moves_into_its_image_without_hard_links_or_specials(tmp_path):
    home = tmp_path / "legacy"
    (home / "sub").mkdir(parents=True)
    (home / "sub" / "keep.txt").write_text("mine\n")
    (home / "link").symlink_to("sub/keep.txt")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the agent's\n")
    os.link(outside, home / "hard.txt")
    os.mkfifo(home / "fifo")
    ready = homes.provision(Settings(home_quota_mb=32), home)
    assert (home / "sub" / "keep.txt").read_text() == "mine\n" and os.readlink(home / "link") == "sub/keep.txt"
    assert not (home / "hard.txt").exists() and not (home / "fifo").exists()
    assert (home / "sub" / "keep.txt").stat().st_uid == ready.uid


def test_release_of_a_busy_home_says_so_and_lazy_detaches(tmp_path):
    settings = Settings(home_quota_mb=32)
    home = tmp_path / "busy"
    homes.provision(settings, home)
    holder = subprocess.Popen(["sleep", "60"], cwd=home)
    try:
        with pytest.raises(homes.HomeBusy, match="in use"):
            homes.release(settings, home)
        homes.release(settings, home, lazy=True)
        assert not os.path.ismount(home)
    finally:
        holder.kill()
        holder.wait()


def test_quota_needs_a_root_worker_and_off_is_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(homes.os, "geteuid", lambda: 1000)
    with pytest.raises(homes.HomeUnavailable, match=r"AGENT_HOME_QUOTA_MB=64\).*not root"):
        homes.provision(Settings(home_quota_mb=64), tmp_path / "x")
    monkeypatch.setattr(homes, "_warned_off", False)
    with caplog.at_level(logging.WARNING, logger="worker.tools.computer.homes"):
        ready = homes.provision(Settings(home_quota_mb=0), tmp_path / "y")
    assert ready.uid is None and ready.quota_bytes is None and not os.path.ismount(tmp_path / "y")
    assert any("NO disk quota" in r.message and r.levelno == logging.WARNING for r in caplog.records)


def test_release_all_unmounts_everything_under_a_root(tmp_path):
    settings = Settings(home_quota_mb=32)
    for name in ("p", "q"):
        homes.provision(settings, tmp_path / name)
    assert len(homes.mounted_under(tmp_path)) == 2
    assert len(homes.release_all(tmp_path)) == 2
    assert homes.mounted_under(tmp_path) == []
