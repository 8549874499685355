"""Offline restore selection and the command line, on manifests written to folders and to S3;
plus the import isolation of recoverydash.sdk (no Django, no Celery)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recoverydash.checkpoints.objects import file_uri, write_manifest_atomically
from recoverydash.checkpoints.selection import select_restorable
from recoverydash.sdk.__main__ import main as cli
from recoverydash.sdk.checkpoint import restore_plan

from .conftest import REPO, free_port

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def make_generation(loc, gen, update, *, world=2, skip=(), corrupt=(), truncate=(),
                    object_update=None, **manifest_extra):
    """Write a generation's objects (one per shard and component) and publish its manifest.
    ``skip``/``corrupt``/``truncate``: (shard, component) pairs to leave out or spoil after the
    manifest recorded the good size and digest."""
    objects = []
    for r in range(world):
        for comp in COMPONENTS:
            path = os.path.join(loc, gen, comp, f"rank{r}.bin")
            data = hashlib.sha256(f"{gen}{r}{comp}".encode()).digest() * 8
            objects.append({"uri": file_uri(path), "shard": f"rank{r}", "component": comp,
                            "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "update": update})
            if (f"rank{r}", comp) in skip:
                objects.pop()
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if (f"rank{r}", comp) in corrupt:
                data = bytes(b ^ 1 for b in data)
            if (f"rank{r}", comp) in truncate:
                data = data[:5]
            with open(path, "wb") as f:
                f.write(data)
    if object_update is not None:
        objects[0]["update"] = object_update
    manifest = {"schema_revision": 1, "generation_id": gen, "update": update,
                "world_size": world, "required_shards": [f"rank{r}" for r in range(world)],
                "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": update * 8}]},
                "dataset_version": "ds-1", "committed_at": f"2026-11-01T00:{update % 60:02d}:00Z",
                "run_id": "run-s", "attempt": 0, **manifest_extra}
    write_manifest_atomically(loc, manifest)
    return manifest


def codes(g):
    return {r["code"] for r in g.reasons}


def test_the_newest_complete_generation_is_chosen(tmp_path):
    loc = str(tmp_path)
    make_generation(loc, "g10", 10)
    make_generation(loc, "g20", 20)
    sel = select_restorable(loc)
    assert sel.generation_id == "g20" and sel.update == 20
    assert sel.cursor == [{"stratum": "main", "epoch": 0, "position": 160}]
    assert [g.status for g in sel.generations] == ["restorable", "committed"]  # g10 not needed


@pytest.mark.parametrize("damage,code", [
    ({"skip": [("rank1", "optimizer"), ("rank1", "model"), ("rank1", "scheduler"),
               ("rank1", "rng"), ("rank1", "data_progress")]}, "shard_missing"),
    ({"skip": [("rank0", "rng"), ("rank1", "rng")]}, "component_missing"),
    ({"corrupt": [("rank1", "optimizer")]}, "digest_mismatch"),
    ({"truncate": [("rank0", "model")]}, "size_mismatch"),
    ({"object_update": 29}, "update_mismatch"),
    ({"schema_revision": 2}, "schema_unsupported"),
])
def test_a_damaged_newer_generation_falls_back_to_the_previous_one(tmp_path, damage, code):
    loc = str(tmp_path)
    make_generation(loc, "g20", 20)
    make_generation(loc, "g30", 30, **damage)
    sel = select_restorable(loc)
    assert sel.generation_id == "g20"
    (rejected,) = sel.rejected
    assert rejected.generation_id == "g30" and code in codes(rejected)


def test_a_missing_object_file_is_object_missing(tmp_path):
    loc = str(tmp_path)
    m = make_generation(loc, "g5", 5)
    os.unlink(m["objects"][3]["uri"][len("file://"):])
    sel = select_restorable(loc)
    assert sel.restorable is None and codes(sel.rejected[0]) == {"object_missing"}


def test_world_size_and_dataset_version_of_the_restarting_job_are_compared(tmp_path):
    loc = str(tmp_path)
    make_generation(loc, "g5", 5)
    assert select_restorable(loc, world_size=2, dataset_version="ds-1").generation_id == "g5"
    assert codes(select_restorable(loc, world_size=4).rejected[0]) == {"world_size_mismatch"}
    assert codes(select_restorable(loc, dataset_version="ds-2").rejected[0]) \
        == {"dataset_version_mismatch"}


def test_scenario_manifests_get_the_expected_verdicts(tmp_path, scenario_loader):
    """Scenario s5_three_of_four_shards: 1,100 has 3 of 4 shards; 1,000 is restorable."""
    events, expect = scenario_loader("s5_three_of_four_shards", str(tmp_path / "objects"))
    loc = str(tmp_path / "ckpt")
    for e in events:
        if e["type"] == "checkpoint_committed":
            write_manifest_atomically(loc, e["manifest"])
    sel = select_restorable(loc, verify_all=True)
    assert sel.generation_id == expect["restore_plan"] == "g1000"
    by_id = {g.generation_id: g for g in sel.generations}
    assert by_id["g1100"].status == "rejected" and "shard_missing" in codes(by_id["g1100"])


def test_a_manifest_on_s3_is_found_and_verified(s3_server):
    _, s3 = s3_server
    s3.create_bucket(Bucket="sel")
    objects = []
    for r in range(2):
        for comp in COMPONENTS:
            data = f"{r}{comp}".encode() * 10
            key = f"run/g3/{comp}/rank{r}"
            s3.put_object(Bucket="sel", Key=key, Body=data)
            objects.append({"uri": f"s3://sel/{key}", "shard": f"rank{r}", "component": comp,
                            "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"schema_revision": 1, "generation_id": "g3", "update": 3, "world_size": 2,
                "required_shards": ["rank0", "rank1"], "components": COMPONENTS,
                "objects": objects, "data_progress": {"cursor": []}, "dataset_version": "d",
                "committed_at": "2026-11-01T00:00:00Z"}
    write_manifest_atomically("s3://sel/run", manifest, s3_client=s3)
    sel = select_restorable("s3://sel/run", s3_client=s3)
    assert sel.generation_id == "g3"
    s3.delete_object(Bucket="sel", Key="run/g3/rng/rank1")
    assert "object_missing" in codes(select_restorable("s3://sel/run", s3_client=s3).rejected[0])


def test_the_cli_exits_0_1_2(tmp_path, capsys):
    loc = str(tmp_path)
    assert cli(["check", loc]) == 1  # empty
    make_generation(loc, "g1", 1)
    make_generation(loc, "g2", 2, corrupt=[("rank0", "model")])
    assert cli(["check", loc]) == 0
    out = capsys.readouterr().out
    assert "g2" in out and "digest_mismatch" in out and "restore g1" in out
    assert cli(["check", loc, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["restorable"]["generation_id"] == "g1"
    assert [g["status"] for g in doc["generations"]] == ["rejected", "restorable"]
    assert cli(["check", loc, "--world-size", "3"]) == 1
    assert cli(["check"]) == 2
    assert cli(["check", "http://host/ckpt"]) == 2
    assert cli(["frobnicate", loc]) == 2
    r = subprocess.run([sys.executable, "-m", "recoverydash.sdk", "check", loc, "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=60,
                       check=False)
    assert r.returncode == 0 and json.loads(r.stdout)["restorable"]["generation_id"] == "g1"


def test_the_cli_takes_a_relative_folder_and_says_the_ledger_was_not_checked(tmp_path, capsys,
                                                                             monkeypatch):
    make_generation(str(tmp_path / "ckpt"), "g1", 1)
    monkeypatch.chdir(tmp_path)
    assert cli(["check", "ckpt"]) == 0
    out = capsys.readouterr().out
    assert "restore g1" in out
    assert "data ledger was not checked" in out
    assert "data_cursor_mismatch" in out and "stale_state" in out
    assert cli(["check", "./ckpt", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["restorable"]["generation_id"] == "g1" and doc["checked"] == "storage"
    assert cli(["check", "missing-folder"]) == 1
    assert "no manifest under " + str(tmp_path / "missing-folder") in capsys.readouterr().out


class _PlanServer:
    def __init__(self, status, body):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self.server.seen.append((self.path, self.headers.get("Authorization")))
                out = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.port = free_port()
        self.srv = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.srv.seen = []
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


def test_restore_plan_asks_the_server_then_falls_back_to_storage(tmp_path):
    loc = str(tmp_path)
    make_generation(loc, "g7", 7)
    up = _PlanServer(200, {"generation_id": "g6", "update": 6, "committed_at": "x",
                           "objects": [], "cursor": [], "warnings": []})
    plan = restore_plan(f"http://127.0.0.1:{up.port}", "tok", "run/s", location=loc,
                        world_size=2)
    assert plan["source"] == "server" and plan["generation_id"] == "g6"
    assert plan["logger_rewind_update"] == 6  # a server without the field: the figure of its answer
    assert up.srv.seen == [("/api/v1/runs/run%2Fs/restore-plan?world_size=2", "Bearer tok")]
    none = _PlanServer(409, {"error": "no_restorable_generation", "rejected": ["g7"]})
    plan = restore_plan(f"http://127.0.0.1:{none.port}", "tok", "r", location=loc)
    assert plan["source"] == "server" and plan["generation_id"] is None
    for p in (up, none):
        p.srv.shutdown()
        p.srv.server_close()
    plan = restore_plan(f"http://127.0.0.1:{free_port()}", "tok", "r", location=loc, timeout=1)
    assert plan["source"] == "storage" and plan["generation_id"] == "g7"
    assert plan["logger_rewind_update"] == 7  # docs/definitions.md#logger-rewind-update
    assert plan["warnings"][0]["code"] == "server_unreachable"
    assert plan["cursor"] == [{"stratum": "main", "epoch": 0, "position": 56}]
    assert restore_plan(None, None, "r")["generation_id"] is None


def test_the_sdk_imports_with_django_and_celery_blocked():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("django", "celery", "kombu", "ninja"):
                    raise ImportError(f"{name} is blocked in this test")
                return None
        sys.meta_path.insert(0, Block())
        import recoverydash.sdk as sdk
        from recoverydash.sdk import CountingRecorder, save_generation, select_restorable
        import recoverydash.sdk.__main__
        c = sdk.Client(None, None, "r", attempt=0)
        c.heartbeat(1)
        assert "torch" not in sys.modules, "torch must be imported lazily"
        assert not [m for m in sys.modules if m.split(".")[0] in ("django", "celery")]
        try:
            import django
        except ImportError:
            print("blocked-ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "blocked-ok"
