"""`--model ORG/NAME` from a local Hugging Face cache (offline, never downloaded).

The cache is built in tmp_path in the hub's own layout: files stored once under blobs/ by
hash, snapshots/<commit>/ holding symlinks to them, refs/main naming the commit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.cost import resolve_config
from autoplan.errors import UnknownNameError, UserInputError
from autoplan.models import load_model, resolve_model_arg
from autoplan.models.hub_cache import NotInHubCacheError, hub_cache_dir, parse_repo_id
from tests.unit.tiny_llama import save_tiny

REPO = "TinyOrg/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_layout(cache: Path, repo: str, files: Path, commit: str = COMMIT,
                ref: str | None = "main") -> Path:
    """Move every file of ``files`` into ``cache`` as the hub stores a downloaded repo."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(files.iterdir()):
        blob = root / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        f.replace(blob)
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
    if ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An HF_HUB_CACHE holding the tiny Llama as TinyOrg/tiny-llama (revision main)."""
    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "autoplan-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # belt and braces: nothing may go online
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    save_tiny(tmp_path / "download")
    _hub_layout(cache, REPO, tmp_path / "download")
    return cache


def test_repo_id_resolves_to_the_cached_snapshot(hub):
    source = resolve_model_arg(REPO)
    assert source.kind == "hf" and source.model_id == REPO
    assert source.path == hub / f"models--TinyOrg--tiny-llama/snapshots/{COMMIT}"
    assert (source.path / "config.json").is_symlink()


def test_model_loads_from_the_cache(hub):
    lm = load_model(REPO)
    assert lm.model_id == REPO
    assert len(lm.spec.layers) == 2 * 7 + 1
    assert lm.tokenizer("ab")["input_ids"]


def test_estimate_reads_only_the_config_from_the_cache(hub):
    # Only config.json is needed: drop the weights' symlink, as a config-only download has.
    snapshot = resolve_model_arg(REPO).path
    (snapshot / "model.safetensors").unlink()
    assert resolve_config(REPO).name == REPO
    result = CliRunner().invoke(cli, ["estimate", "--model", REPO, "--target", "h100",
                                      "--precision", "fp8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["candidate"]["model"] == REPO


def test_revision_suffix_and_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hub_cache_dir() == tmp_path / "hfhome" / "hub"
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "config.json").write_text("{}")
    _hub_layout(tmp_path / "hfhome" / "hub", "Org/m", tmp_path / "files", ref="v1.0")
    assert resolve_model_arg("Org/m@v1.0").path.name == COMMIT
    with pytest.raises(NotInHubCacheError, match="revision"):
        resolve_model_arg("Org/m")  # only v1.0 was downloaded, not main


def test_missing_repo_is_one_line_naming_the_folder_and_the_download(hub, tmp_path):
    result = CliRunner().invoke(cli, ["estimate", "--model", "NoOrg/absent", "--target", "h100"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert str(hub / "models--NoOrg--absent") in lines[0]
    assert "never downloads" in lines[0] and "hf download NoOrg/absent" in lines[0]
    with pytest.raises(NotInHubCacheError, match="hf download NoOrg/absent"):
        resolve_model_arg("NoOrg/absent")


def test_snapshot_without_config_is_refused(hub, tmp_path):
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "README.md").write_text("weights were never fetched")
    _hub_layout(hub, "Org/partial", tmp_path / "partial")
    with pytest.raises(NotInHubCacheError, match="no config.json"):
        resolve_model_arg("Org/partial")


def test_local_paths_and_aliases_still_win(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_tiny(tmp_path / "TinyOrg" / "tiny-llama")  # a local folder of the same name
    assert resolve_model_arg(REPO).path == Path(REPO)
    with pytest.raises(UnknownNameError):
        resolve_model_arg("not-a-repo")
    with pytest.raises(UserInputError):
        resolve_model_arg("/abs/missing/path")


@pytest.mark.parametrize("text", ["a/b/c", "../x", "./m", "/x/y", "org/", "org/na me"])
def test_texts_that_are_not_repo_ids(text):
    assert parse_repo_id(text) is None
