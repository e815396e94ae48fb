"""Files and folders written atomically get the modes a plain open / mkdir would give them
under the process's umask (tempfile's 0600 / 0700 would hide an export or a plan from a
server running as another user)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from autoplan.atomic import atomic_dir, atomic_new_dir, write_json_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_writes_follow_the_umask(tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        plan = write_json_atomic(tmp_path / "plan.json", {"a": 1})
        with atomic_dir(tmp_path / "export", is_ours=lambda p: False) as out:
            (out / "model.safetensors").write_bytes(b"x")
        cache = tmp_path / "cache" / "abc"
        with atomic_new_dir(cache, complete=lambda p: p.exists()) as tmp:
            (tmp / "done").write_text("1")
        plain_file, plain_dir = tmp_path / "plain", tmp_path / "plain_dir"
        plain_file.write_text("x")
        plain_dir.mkdir()
    finally:
        os.umask(old)
    assert _mode(plan) == _mode(plain_file) == 0o666 & ~mask
    assert _mode(tmp_path / "export") == _mode(cache) == _mode(plain_dir) == 0o777 & ~mask
