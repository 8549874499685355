"""The ``check`` command line on framework folders (auto-detection, words, --json, --hash, exit
codes, relative folders, S3), and the restricted unpickler's refusal to run anything."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys

import pytest

from recoverydash.checkpoints.formats import StderrProgress, check, detect
from recoverydash.checkpoints.formats.readers import (
    Refused,
    UnreadableFile,
    read_pickle,
    read_safetensors_header,
)
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.sdk.__main__ import main as cli

from .conftest import dcp_save, deepspeed_save, megatron_save, orbax_step, truncate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_cli_names_the_newest_restorable_first_then_every_generation(ckpt, capsys):
    pytest.importorskip("torch")
    dcp_save(ckpt, 10)
    path = dcp_save(ckpt, 20)
    truncate(os.path.join(path, "__0_0.distcp"), 64)
    assert cli(["check", str(ckpt)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("restore step-10 (update 10, committed ")
    assert lines[1].startswith("format dcp: committed by .metadata")
    assert lines[2].split() == ["step-20", "update", "20", "rejected"]
    assert lines[3].strip().startswith("size_mismatch: step-20/__0_0.distcp: 64 bytes")
    assert lines[4].split() == ["*", "step-10", "update", "10", "restorable"]
    assert "structural check" in lines[-1]


def test_the_cli_json_exit_codes_and_format_option(ckpt, capsys, monkeypatch):
    pytest.importorskip("torch")
    deepspeed_save(ckpt, 10, skip_optim={0})
    assert cli(["check", str(ckpt), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "deepspeed" and doc["restorable"] is None
    assert doc["generations"][0]["status"] == "rejected"
    # rank 0's model states are there, its optimizer partition is not
    assert [r["code"] for r in doc["generations"][0]["reasons"]] == ["object_missing"]
    assert doc["checked"] == "storage"
    deepspeed_save(ckpt, 5)
    (ckpt / "latest").write_text("global_step10")
    monkeypatch.chdir(ckpt.parent)
    assert cli(["check", "ckpt", "--format", "deepspeed", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["restorable"]["generation_id"] == "global_step5"
    assert cli(["check", "ckpt", "--format", "megatron"]) == 1  # nothing of that format here
    assert "no megatron generation under" in capsys.readouterr().out
    assert cli(["check", "ckpt", "--format", "nope"]) == 2
    assert cli(["check", "ckpt", "--world-size", "0"]) == 2


def test_an_unknown_layout_and_an_empty_folder_exit_1(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert cli(["check", str(tmp_path)]) == 1
    assert "no checkpoint layout recognised" in capsys.readouterr().out
    assert cli(["check", str(tmp_path / "absent")]) == 1
    assert "no manifest under" in capsys.readouterr().out


def test_hash_records_every_files_sha256_with_progress_on_stderr(ckpt, capsys):
    pytest.importorskip("torch")
    megatron_save(ckpt, 10)
    assert cli(["check", str(ckpt), "--hash", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    objs = doc["generations"][0]["objects"]
    assert len(objs) == 2
    for o in objs:
        with open(ckpt / o["path"], "rb") as f:
            assert o["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert "hashing" in captured.err
    out = io.StringIO()
    p = StderrProgress(2048, every=0.0, stream=out)
    p.update(1024)
    p.close()
    assert "(50%)" in out.getvalue() and "MiB done" in out.getvalue()


def test_the_cli_runs_as_a_module_on_a_relative_folder(ckpt):
    orbax_step(ckpt, 3)
    r = subprocess.run([sys.executable, "-m", "recoverydash.sdk", "check", "ckpt", "--json"],
                       capture_output=True, text=True, cwd=ckpt.parent, timeout=120,
                       check=False, env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restorable"]["generation_id"] == "3"


def test_detection_tells_each_layout_apart(tmp_path):
    pytest.importorskip("torch")
    layouts = {"dcp": lambda p: dcp_save(p, 1), "deepspeed": lambda p: deepspeed_save(p, 1),
               "megatron": lambda p: megatron_save(p, 1), "orbax": lambda p: orbax_step(p, 1)}
    for name, build in layouts.items():
        root = tmp_path / name
        root.mkdir()
        build(root)
        assert detect(Tree(str(root))) == name


def test_s3_prefix_is_checked_through_ranged_reads(ckpt, s3_server):
    pytest.importorskip("torch")
    _endpoint, client = s3_server
    client.create_bucket(Bucket="adopt")
    deepspeed_save(ckpt, 10)
    deepspeed_save(ckpt, 20, skip_optim={2})
    orbax = ckpt.parent / "orbax"
    orbax_step(orbax, 7)                     # renamed into place, but no commit_success.txt
    orbax_step(orbax, 5, commit_file=True)
    for root, prefix in ((ckpt, "ds"), (orbax, "ox")):
        for dirpath, _, files in os.walk(root):
            for f in files:
                full = os.path.join(dirpath, f)
                client.upload_file(full, "adopt", f"{prefix}/{os.path.relpath(full, root)}")
    result = check("s3://adopt/ds", s3_client=client)
    assert result.format == "deepspeed"
    assert [(g.generation_id, g.status) for g in result.generations] == \
        [("global_step20", "rejected"), ("global_step10", "restorable")]
    assert result.generations[1].objects[0].uri.startswith("s3://adopt/ds/global_step10/")
    result = check("s3://adopt/ox", s3_client=client)
    assert [(g.generation_id, g.status, [r["code"] for r in g.reasons])
            for g in result.generations] == [("7", "pending", ["never_committed"]),
                                             ("5", "restorable", [])]


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/recoverydash-pwned",))


def test_the_restricted_unpickler_runs_nothing_from_the_file(tmp_path):
    if os.path.exists("/tmp/recoverydash-pwned"):
        os.remove("/tmp/recoverydash-pwned")
    got = read_pickle(pickle.dumps({"evil": _Boom(), "n": 3}))
    assert not os.path.exists("/tmp/recoverydash-pwned")
    assert isinstance(got.obj["evil"], Refused) and got.obj["n"] == 3
    assert got.refused == {"posix.system"}
    with pytest.raises(UnreadableFile) as e:
        read_pickle(pickle.dumps(list(range(100)))[:-20])
    assert e.value.code == "size_mismatch"


def test_safetensors_header_must_end_at_the_files_size():
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    blob = len(header).to_bytes(8, "little") + header + b"\0" * 16
    assert read_safetensors_header(blob, len(blob)).declared_size == len(blob)
    with pytest.raises(UnreadableFile, match="truncated"):
        read_safetensors_header(blob, len(blob) - 4)
    with pytest.raises(UnreadableFile, match="after the last tensor"):
        read_safetensors_header(blob, len(blob) + 4)
    bad = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}).encode()
    with pytest.raises(UnreadableFile, match="data_offsets"):
        read_safetensors_header(len(bad).to_bytes(8, "little") + bad, 8 + len(bad) + 16)
