"""publish_files (a trainer's own files as a generation) and relative folders everywhere."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from recoverydash.checkpoints.objects import MANIFEST_NAME
from recoverydash.checkpoints.selection import select_restorable
from recoverydash.sdk.checkpoint import merge_cursors, publish_files, resolve_location

from .test_ledger import CaptureClient


def write(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.fixture
def trainer_files(tmp_path):
    """An HF-like checkpoint folder: weights, optimizer, scheduler, rng, trainer state."""
    d = tmp_path / "out" / "checkpoint-40"
    files = {"model": write(str(d / "model.safetensors"), b"w" * 1000),
             "optimizer": write(str(d / "optimizer.pt"), b"o" * 2000),
             "scheduler": write(str(d / "scheduler.pt"), b"s" * 10),
             "rng": write(str(d / "rng_state.pth"), b"r" * 20),
             "data_progress": write(str(d / "trainer_state.json"), b'{"global_step": 40}')}
    return d, files


def test_it_publishes_a_trainers_files_with_sizes_and_digests_from_a_relative_folder(
        tmp_path, monkeypatch, trainer_files):
    _, files = trainer_files
    monkeypatch.chdir(tmp_path)
    client = CaptureClient(rank=0)
    cursor = [{"stratum": "main", "epoch": 0, "position": 320}]
    result = publish_files("ckpt", "u000000040-a0", 40, files, client=client,
                           data_progress={"cursor": cursor}, dataset_version="ds-1")
    assert result and result.published and not result.already and not result.warnings
    path = tmp_path / "ckpt" / "u000000040-a0" / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    assert manifest == result.manifest
    assert manifest["update"] == 40 and manifest["data_progress"]["cursor"] == cursor
    assert manifest["required_shards"] == ["rank0"] and manifest["world_size"] == 1
    by_component = {o["component"]: o for o in manifest["objects"]}
    for component, p in files.items():
        with open(p, "rb") as f:
            data = f.read()
        assert by_component[component]["uri"] == "file://" + os.path.abspath(p)
        assert by_component[component]["size"] == len(data)
        assert by_component[component]["sha256"] == hashlib.sha256(data).hexdigest()
    assert [e["type"] for e in client.events] == ["checkpoint_started", "shard_written",
                                                  "checkpoint_committed"]
    sel = select_restorable("ckpt")
    assert sel.generation_id == "u000000040-a0" and sel.cursor == cursor


def test_it_lists_a_file_holding_several_components_once(tmp_path):
    ckpt = write(str(tmp_path / "epoch=0-step=8.ckpt"), b"lightning" * 100)
    result = publish_files(str(tmp_path / "loc"), "g8", 8, {
        "model": ckpt, "optimizer": ckpt, "scheduler": ckpt, "rng": ckpt, "data_progress": ckpt})
    (obj,) = result.manifest["objects"]
    assert obj["component"] == "model"
    assert obj["components"] == ["model", "optimizer", "scheduler", "rng", "data_progress"]
    assert not result.warnings
    assert select_restorable(str(tmp_path / "loc")).generation_id == "g8"


def test_a_republished_identical_generation_is_no_error_and_a_different_one_is_refused(
        tmp_path, trainer_files):
    _, files = trainer_files
    loc = str(tmp_path / "loc")
    first = publish_files(loc, "g40", 40, files)
    again = publish_files(loc, "g40", 40, files)  # the same save, seen again on resume
    assert again.published and again.already and again.manifest == first.manifest
    write(files["model"], b"different weights")
    other = publish_files(loc, "g40", 40, files)
    assert not other.published and "already committed" in other.reason
    with open(os.path.join(loc, "g40", MANIFEST_NAME)) as f:
        assert json.loads(f.read()) == first.manifest


def test_it_never_raises_and_says_why_nothing_was_published(tmp_path, trainer_files):
    _, files = trainer_files
    missing = publish_files(str(tmp_path / "loc"), "g1", 1, {**files, "model": "/no/such/file"})
    assert not missing and "no/such/file" in missing.reason
    assert not os.path.exists(tmp_path / "loc" / "g1" / MANIFEST_NAME)
    bad = publish_files(None, "g1", 1, files)  # type: ignore[arg-type]
    assert not bad.published and bad.reason
    partial = publish_files(str(tmp_path / "loc"), "g2", 2, {"model": files["model"]})
    assert partial.published
    assert partial.warnings == [f"required component {c!r} has no file"
                                for c in ("optimizer", "scheduler", "rng", "data_progress")]
    sel = select_restorable(str(tmp_path / "loc"))
    (g2,) = [g for g in sel.generations if g.generation_id == "g2"]
    assert g2.status == "rejected" and g2.reasons[0]["code"] == "component_missing"


def test_a_relative_folder_resolves_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_location("ckpt") == str(tmp_path / "ckpt")
    assert resolve_location("./a/../b") == str(tmp_path / "b")
    for given in ("/abs/x", "file:///abs/x", "s3://bucket/p"):
        assert resolve_location(given) == given


def test_save_generation_saves_into_a_relative_folder(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from recoverydash.sdk.checkpoint import load_generation, save_generation

    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    manifest = save_generation("ckpt", "g1", 1, state={"model": model.state_dict(),
                                                       "optimizer": opt.state_dict()},
                               rank_state={"scheduler": {"last_epoch": 1}})
    assert manifest is not None
    assert (tmp_path / "ckpt" / "g1" / MANIFEST_NAME).exists()
    assert all(o["uri"].startswith(f"file://{tmp_path}/ckpt/g1/") for o in manifest["objects"])
    assert select_restorable("ckpt").generation_id == "g1"
    out = load_generation("ckpt", "g1", state={"model": model.state_dict()})
    assert out["scheduler"] == {"last_epoch": 1}


def test_the_published_cursor_is_the_maximum_over_ranks():
    ranks = [[{"stratum": "main", "epoch": 1, "position": 61}],
             [{"stratum": "main", "epoch": 1, "position": 64},
              {"stratum": "aux", "epoch": 0, "position": 3}],
             [{"stratum": "main", "epoch": 0, "position": 96}]]
    assert merge_cursors(ranks) == [{"stratum": "aux", "epoch": 0, "position": 3},
                                    {"stratum": "main", "epoch": 1, "position": 64}]
