"""The pod-like environment of the collector's ``validate``: probed whole, so a host that refuses it skips.

``validate`` runs the collector under ``unshare -m`` with a tmpfs mounted on /run. Where ``unshare -m`` works
but the mount is refused (some containers), probing ``unshare -m true`` alone passed, and every validate then
failed with the mount's error instead of saying why it could not run. Here a fake ``unshare`` on PATH plays such
a host, without root and without the collector.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mmfleet_lab.cluster import collector


def _fake_unshare(directory: Path, script: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "unshare"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)


def test_a_host_that_refuses_the_tmpfs_mount_is_said_so_not_a_failed_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `unshare -m true` succeeds; anything that mounts fails as mount(8) does without CAP_SYS_ADMIN.
    refuses = 'if [ "$1 $2" = "-m true" ]; then exit 0; fi\necho "mount: /run: permission denied." >&2; exit 32'
    _fake_unshare(tmp_path / "bin", refuses)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(collector, "ensure_collector", lambda *_: pytest.fail("validate ran past its probe"))
    with pytest.raises(collector.PodEnvironmentError, match=r"tmpfs on /run.*permission denied"):
        collector.validate({}, tmp_path)


def test_no_unshare_is_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(collector.PodEnvironmentError, match="no unshare command"):
        collector.validate({}, tmp_path)
