"""GGUF conversion guards (issue 13 item 1): an architecture without a name map is refused
before any tensor is read, and a killed conversion's temp folder is removed by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoplan.errors import UserInputError
from autoplan.models import gguf_convert
from autoplan.atomic import atomic_new_dir
from autoplan.models._cache import is_model_folder


def test_an_architecture_without_a_name_map_is_named():
    with pytest.raises(UserInputError) as info:
        gguf_convert.check_name_map("opt", "opt-gguf")
    msg = str(info.value)
    assert "'opt-gguf' (HF model type 'opt')" in msg and "\n" not in msg
    gguf_convert.check_name_map("llama")  # mapped: no error
    gguf_convert.check_name_map("gemma3_text", "gemma3")  # gguf-py's name for it


def test_refused_before_any_dequantization(tmp_path, monkeypatch):
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    src = tmp_path / "opt-125m.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda *a, **k: SimpleNamespace(model_type="opt"))

    def never(*_a, **_k):
        raise AssertionError("tensors were read before the name-map check")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    dest = tmp_path / "cache" / "opt"
    with pytest.raises(UserInputError, match="'opt'"):
        gguf_convert.convert_gguf(src, dest)
    assert not dest.exists() and not list((tmp_path / "cache").glob(".*"))


def _age(path: Path, seconds: float = 3600) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_stale_temps_go_but_live_and_new_ones_stay(tmp_path):
    dest = tmp_path / "model-abc"
    stale = tmp_path / ".model-abc.k1ll3d.tmp"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.safetensors").write_bytes(b"x" * 1024)
    _age(stale)
    live = tmp_path / ".model-abc.l1ve.tmp"
    live.mkdir()
    _age(live)
    other = tmp_path / ".other-model.old.tmp"  # another model's temp: not ours to judge
    other.mkdir()
    _age(other)
    fresh = tmp_path / ".model-abc.fr3sh.tmp"  # newer than this process: maybe a live writer
    fresh.mkdir()
    os.utime(fresh, (time.time() + 60, time.time() + 60))
    fd = gguf_convert._lock_dir(live, wait=True)
    try:
        removed = gguf_convert.remove_stale_temps(dest)
    finally:
        os.close(fd)
    assert removed == [stale] and not stale.exists()
    assert live.is_dir() and other.is_dir() and fresh.is_dir()


_HOLDER = """
import sys, time
from pathlib import Path
from autoplan.models import gguf_convert
from autoplan.atomic import atomic_new_dir
from autoplan.models._cache import is_model_folder
with atomic_new_dir(Path(sys.argv[1]), complete=is_model_folder) as tmp:
    gguf_convert._lock_dir(tmp, wait=True)
    (tmp / "part.safetensors").write_bytes(b"x" * 4096)
    print(tmp, flush=True)
    time.sleep(600)
"""
_CLEANER = """
import sys
from pathlib import Path
from autoplan.models import gguf_convert
print(len(gguf_convert.remove_stale_temps(Path(sys.argv[1]))))
"""


def test_a_killed_conversion_is_cleaned_by_the_next_run(tmp_path):
    dest = tmp_path / "models" / "m-1"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(dest)], stdout=subprocess.PIPE,
                              text=True)
    try:
        tmp = Path(holder.stdout.readline().strip())
        assert tmp.is_dir()
        _age(tmp)
        cleaner = [sys.executable, "-c", _CLEANER, str(dest)]
        assert subprocess.run(cleaner, capture_output=True, text=True,
                              check=True).stdout.strip() == "0"  # alive: kept
        assert tmp.is_dir()
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        assert tmp.is_dir()  # kill -9 leaves it behind
        assert subprocess.run(cleaner, capture_output=True, text=True,
                              check=True).stdout.strip() == "1"
        assert not tmp.exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_atomic_dir_still_publishes(tmp_path):
    dest = tmp_path / "m"
    with atomic_new_dir(dest, complete=is_model_folder) as tmp:
        fd = gguf_convert._lock_dir(tmp, wait=True)
        (tmp / "config.json").write_text("{}")
    os.close(fd)
    assert (dest / "config.json").is_file()
    assert not list(tmp_path.glob(".m.*"))
