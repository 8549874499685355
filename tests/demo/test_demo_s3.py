"""The `make demo` pipeline in S3 mode: the same real server process and 4-rank gloo jobs, with
every run's checkpoints in an S3 bucket served by moto (``ThreadedMotoServer`` in this process,
reached over HTTP by the demo, its ranks and the server's worker alike). Asserts each conclusion
and what the bucket holds afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
moto_server = pytest.importorskip("moto.server")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# killed mid-shard (a torn object, no manifest), commit event lost (discovery in the bucket),
# omission (a restore from the bucket)
FAULTS = "b,d,f"
BUCKET = "recoverydash-demo"
PREFIX = "ckpt/test"
KEYS = {"AWS_ACCESS_KEY_ID": "demo-access-key", "AWS_SECRET_ACCESS_KEY": "demo-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1"}
MANIFEST = "recoverydash-manifest.json"


@pytest.fixture(scope="module")
def s3_demo(tmp_path_factory):
    from recoverydash.checkpoints.objects import make_s3_client
    from recoverydash.demo.util import free_port

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(),
                                            verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = make_s3_client(endpoint, "us-east-1", KEYS["AWS_ACCESS_KEY_ID"],
                            KEYS["AWS_SECRET_ACCESS_KEY"])
        s3.create_bucket(Bucket=BUCKET)
        # a leftover of an earlier demo run under a run prefix: the demo must clear it
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/demo-d-commit-event-lost/u000000009-a0/"
                      f"{MANIFEST}", Body=b"{}")
        base = tmp_path_factory.mktemp("demo-s3")
        env = {**os.environ, **KEYS, "DEMO_EXIT": "1", "DEMO_ONLY": FAULTS,
               "PORT": str(free_port()), "RECOVERYDASH_DEMO_DIR": str(base / "demo"),
               "DEMO_ANALYSIS_TIMEOUT": "90", "RECOVERYDASH_DEMO_S3": f"s3://{BUCKET}/{PREFIX}",
               "RECOVERYDASH_DEMO_S3_ENDPOINT": endpoint}
        for k in ("DATABASE_URL", "CELERY_BROKER_URL", "DEMO_SCREENSHOTS", "AWS_PROFILE",
                  "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
            env.pop(k, None)
        proc = subprocess.run([sys.executable, "-m", "recoverydash.demo"], cwd=str(REPO),
                              env=env, capture_output=True, text=True, timeout=240, check=False)
        results_path = base / "demo" / "results.json"
        results = json.loads(results_path.read_text()) if results_path.exists() else None
        contents = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for o in page.get("Contents", ()):
                contents[o["Key"]] = o["Size"]
        yield {"proc": proc, "results": results, "base": base / "demo", "s3": s3,
               "contents": contents, "endpoint": endpoint}
    finally:
        server.stop()


def _run_prefix(key: str, results) -> str:
    run_id = next(r["run_id"] for r in results["runs"] if r["key"] == key)
    return f"{PREFIX}/{run_id}/"


def _manifest(s3, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def test_the_s3_demo_exits_0_and_every_conclusion_matches(s3_demo):
    proc, results = s3_demo["proc"], s3_demo["results"]
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert results and results["ok"]
    assert sorted(r["key"] for r in results["runs"]) == FAULTS.split(",")
    assert all(r["ok"] and not r["mismatches"] for r in results["runs"]), results["runs"]
    assert "3/3 conclusions match" in proc.stdout
    assert f"checkpoints: S3: s3://{BUCKET}/{PREFIX}/<run_id>" in proc.stdout
    assert f"endpoint {s3_demo['endpoint']}" in proc.stdout
    assert "deleted 1 object(s) of earlier demo runs" in proc.stdout
    # nothing of the keys' secret is printed
    assert KEYS["AWS_SECRET_ACCESS_KEY"] not in proc.stdout + proc.stderr


def test_every_run_lives_in_the_bucket_and_not_in_a_local_folder(s3_demo):
    results = s3_demo["results"]
    assert results["storage"]["mode"] == "s3"
    for r in results["runs"]:
        assert results["storage"]["locations"][r["run_id"]] == f"s3://{BUCKET}/{PREFIX}/" \
            + r["run_id"]
    ckpt = s3_demo["base"] / "ckpt"
    assert not ckpt.exists() or not any(ckpt.iterdir())
    assert not any(k.endswith("u000000009-a0/" + MANIFEST) for k in s3_demo["contents"])


def test_published_manifests_and_their_objects_are_in_the_bucket(s3_demo):
    results, s3, contents = s3_demo["results"], s3_demo["s3"], s3_demo["contents"]
    manifests = [k for k in contents if k.endswith("/" + MANIFEST)]
    for key in FAULTS.split(","):
        prefix = _run_prefix(key, results)
        mine = [k for k in manifests if k.startswith(prefix)]
        assert mine, (key, sorted(contents))
        for mkey in mine:
            m = _manifest(s3, mkey)
            assert mkey == f"{prefix}{m['generation_id']}/{MANIFEST}"
            assert m["world_size"] in (2, 4) and m["objects"]
            components = set()
            for obj in m["objects"]:
                assert obj["uri"].startswith(f"s3://{BUCKET}/{prefix}{m['generation_id']}/")
                okey = obj["uri"][len(f"s3://{BUCKET}/"):]
                assert contents.get(okey) == obj["size"], (okey, obj)
                components.add(obj["component"])
            assert {"model", "optimizer", "scheduler", "rng", "data_progress"} <= components


def test_killed_mid_shard_leaves_a_torn_object_and_no_manifest_in_the_bucket(s3_demo):
    results, s3, contents = s3_demo["results"], s3_demo["s3"], s3_demo["contents"]
    gen = _run_prefix("b", results) + "u000000004-a0/"
    assert gen + MANIFEST not in contents
    assert _run_prefix("b", results) + "u000000002-a0/" + MANIFEST in contents
    torn = gen + "data_progress/rank3.json"
    assert torn in contents
    body = s3.get_object(Bucket=BUCKET, Key=torn)["Body"].read()
    with pytest.raises(ValueError):
        json.loads(body)  # half of the JSON document
    whole = s3.get_object(Bucket=BUCKET, Key=gen + "data_progress/rank0.json")["Body"].read()
    assert json.loads(whole)["update"] == 4
    assert len(body) < len(whole)
    run = next(r for r in results["runs"] if r["key"] == "b")
    assert any("u000000004-a0: abandoned" in line for line in run["concluded"])


def test_the_lost_commit_event_is_discovered_in_the_bucket(s3_demo):
    results, contents = s3_demo["results"], s3_demo["contents"]
    assert _run_prefix("d", results) + "u000000004-a0/" + MANIFEST in contents
    answer = results["answers"][next(r["run_id"] for r in results["runs"] if r["key"] == "d")]
    g = next(g for g in answer["generations"] if g["generation_id"] == "u000000004-a0")
    assert g["status"] == "restorable"
    r = next(r for r in answer["restarts"] if r["attempt"] == 1)
    assert (r["resumed_from"], r["verdict"], r["recomputed"]) == ("u000000004-a0", "exact", 0)
    assert "manifest discovery ingested 1 manifest(s)" in s3_demo["proc"].stdout


def test_restoring_from_the_bucket_resumes_at_the_read_cursor_an_omission(s3_demo):
    results = s3_demo["results"]
    answer = results["answers"][next(r["run_id"] for r in results["runs"] if r["key"] == "f")]
    r = next(r for r in answer["restarts"] if r["attempt"] == 1)
    assert (r["resumed_from"], r["verdict"], r["omitted"], r["replayed"]) \
        == ("u000000004-a0", "omission", 24, 0)


def test_the_server_verified_every_object_and_discovered_the_manifest_in_the_bucket(s3_demo):
    """Read from the demo instance's own SQLite (stdlib sqlite3: no second Django setup): the
    worker checked each manifest object in the bucket with the location's endpoint and keys, and
    discovery found the manifest whose commit event was never sent."""
    import sqlite3

    db = sqlite3.connect(s3_demo["base"] / "var" / "recoverydash.sqlite3")
    try:
        rows = db.execute("SELECT uri, check_status, check_detail FROM runs_checkpointobject "
                          "WHERE in_manifest").fetchall()
        discovered = db.execute(
            "SELECT r.run_id, g.generation_id FROM runs_generation g JOIN runs_run r "
            "ON r.id = g.run_id WHERE g.discovered").fetchall()
        locations = db.execute("SELECT url, endpoint_url, access_key_id, last_error, "
                               "last_listed_at FROM storage_storagelocation").fetchall()
    finally:
        db.close()
    assert rows
    for uri, status, detail in rows:
        assert uri.startswith(f"s3://{BUCKET}/{PREFIX}/")
        assert status == "ok" and "ChecksumSHA256" in detail, (uri, status, detail)
    assert discovered == [("demo-d-commit-event-lost", "u000000004-a0")]
    assert len(locations) == 3
    for url, endpoint, key_id, last_error, listed in locations:
        assert url.startswith(f"s3://{BUCKET}/{PREFIX}/demo-")
        assert (endpoint, key_id, last_error) == (s3_demo["endpoint"],
                                                  KEYS["AWS_ACCESS_KEY_ID"], "")
        assert listed is not None
