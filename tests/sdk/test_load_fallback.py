"""load_generation checks every object against the manifest before DCP sees it, and on a failure
reports ``restore_failed`` and loads the next restorable generation instead of crashing the job
(docs/ingest-v1.md#restore_failed)."""

from __future__ import annotations

import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from recoverydash.sdk import Restored  # noqa: E402
from recoverydash.sdk.checkpoint import load_generation, save_generation  # noqa: E402


class Events:
    """Stands in for the SDK client: records what load_generation reports."""

    def __init__(self):
        self.sent = []

    def restore_failed(self, generation_id, reason, message=""):
        self.sent.append(("restore_failed", generation_id, reason, message))

    def restore_completed(self, generation_id, seconds):
        self.sent.append(("restore_completed", generation_id))

    def flush(self, timeout=None):
        return True


def _save(loc, gen, update, weight):
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.fill_(weight)
    return save_generation(loc, gen, update, state={"model": model.state_dict()},
                           rank_state={"scheduler": {"last_epoch": update}},
                           required_components=["model", "scheduler", "rng"])


@pytest.fixture
def two_generations(tmp_path):
    loc = str(tmp_path / "ckpt")
    assert _save(loc, "g40", 40, 4.0) is not None
    assert _save(loc, "g60", 60, 6.0) is not None
    return loc


def _distcp(loc, gen):
    folder = os.path.join(loc, gen, "model")
    return os.path.join(folder, next(n for n in os.listdir(folder) if n.endswith(".distcp")))


def _load(loc, gen, events):
    model = torch.nn.Linear(4, 1)
    sd = model.state_dict()
    out = load_generation(loc, gen, state={"model": sd}, client=events, restore_rng=False)
    return out, sd


def test_it_loads_the_named_generation_when_its_objects_match(two_generations):
    events = Events()
    out, sd = _load(two_generations, "g60", events)
    assert isinstance(out, Restored) and out.generation_id == "g60" and out.update == 60
    assert out["scheduler"] == {"last_epoch": 60} and out.skipped == []
    assert float(sd["weight"][0, 0]) == 6.0
    assert out.resumed_from == {"generation_id": "g60", "update": 60, "cursor": []}
    assert events.sent == [("restore_completed", "g60")]


def test_it_skips_a_truncated_shard_and_loads_the_previous_generation(two_generations):
    path = _distcp(two_generations, "g60")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    events = Events()
    out, sd = _load(two_generations, "g60", events)
    assert (out.generation_id, out.update, out["scheduler"]) == ("g40", 40, {"last_epoch": 40})
    assert float(sd["weight"][0, 0]) == 4.0  # g40's bytes, DCP never read g60's
    [(kind, gen, reason, message), done] = events.sent
    assert (kind, gen, reason, done) == ("restore_failed", "g60", "object_damaged",
                                         ("restore_completed", "g40"))
    assert "size_mismatch" in message and os.path.basename(path) in message
    assert out.skipped == [{"generation_id": "g60", "reason": "object_damaged",
                            "message": message}]


def test_it_checks_the_sha256_of_an_object_of_the_right_size(two_generations):
    path = _distcp(two_generations, "g60")
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    events = Events()
    out, _ = _load(two_generations, "g60", events)
    assert out.generation_id == "g40"
    assert events.sent[0][:3] == ("restore_failed", "g60", "object_damaged")
    assert "digest_mismatch" in events.sent[0][3]


def test_it_checks_the_files_of_a_copied_folder_not_the_originals(two_generations, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(two_generations, copy)  # the manifests still name the original files
    path = _distcp(copy, "g60")
    with open(path, "r+b") as f:
        f.truncate(10)
    events = Events()
    out, _ = _load(copy, "g60", events)
    assert out.generation_id == "g40"
    assert events.sent[0][:3] == ("restore_failed", "g60", "object_damaged")


def test_it_returns_a_fresh_start_when_nothing_is_left_and_the_state_is_untouched(
        two_generations):
    for gen in ("g40", "g60"):
        os.remove(_distcp(two_generations, gen))
    events = Events()
    out, sd = _load(two_generations, "g60", events)
    assert out.generation_id is None and out.resumed_from is None and dict(out) == {}
    # g40 is not restorable in storage either, so it is not tried: nothing is left
    assert [(e[0], e[1], e[2]) for e in events.sent] == [
        ("restore_failed", "g60", "object_damaged"),
        ("restore_failed", "g60", "nothing_restorable")]
    assert events.sent[1][3] == "no restorable generation left after ['g60']"
    assert [s["generation_id"] for s in out.skipped] == ["g60"]
    assert float(sd["weight"][0, 0]) != 6.0  # the state was never written


def test_it_falls_back_when_loading_raises_and_raises_when_nothing_is_left(two_generations):
    import json

    from recoverydash.checkpoints.objects import MANIFEST_NAME
    from recoverydash.sdk import RestoreError

    # bytes of the right size that DCP cannot read, and a manifest without digests: only the
    # load can find out
    for gen in ("g60", "g40"):
        path = _distcp(two_generations, gen)
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(b"\0" * size)
        mpath = os.path.join(two_generations, gen, MANIFEST_NAME)
        with open(mpath) as f:
            m = json.load(f)
        for o in m["objects"]:
            o.pop("sha256", None)
        with open(mpath, "w") as f:
            json.dump(m, f)
    events = Events()
    with pytest.raises(RestoreError):
        _load(two_generations, "g60", events)
    assert [(e[0], e[1], e[2]) for e in events.sent] == [
        ("restore_failed", "g60", "load_error"), ("restore_failed", "g40", "load_error"),
        ("restore_failed", "g40", "nothing_restorable")]
    assert events.sent[2][3] == (
        "no restorable generation left after ['g60', 'g40']; a load had begun writing into the "
        "state, so it is not a fresh start (RestoreError)")


def test_it_says_nothing_restorable_when_the_named_generation_is_not_in_storage(tmp_path):
    loc = str(tmp_path / "empty")
    os.makedirs(loc)
    events = Events()
    out, _ = _load(loc, "g60", events)
    assert out.generation_id is None and out.skipped == [
        {"generation_id": "g60", "reason": "object_damaged",
         "message": f"no readable manifest for g60 under {loc}"}]
    assert events.sent == [
        ("restore_failed", "g60", "object_damaged", f"no readable manifest for g60 under {loc}"),
        ("restore_failed", "g60", "nothing_restorable",
         "no restorable generation left after ['g60']")]


def test_it_says_nothing_restorable_when_the_location_cannot_be_resolved():
    from recoverydash.sdk import RestoreError

    events = Events()
    with pytest.raises(RestoreError):
        _load("", "g60", events)
    assert events.sent == [
        ("restore_failed", "g60", "load_error", "location: expected a folder or URI, got ''"),
        ("restore_failed", "g60", "nothing_restorable",
         "no generation can be read: the location '' cannot be resolved")]



def test_it_skips_a_damaged_s3_object_and_loads_the_previous_generation(s3_server, tmp_path):
    _, s3 = s3_server
    s3.create_bucket(Bucket="fallback")
    loc = "s3://fallback/run"
    for gen, update, weight in (("g40", 40, 4.0), ("g60", 60, 6.0)):
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            model.weight.fill_(weight)
        assert save_generation(loc, gen, update, state={"model": model.state_dict()},
                               rank_state={"scheduler": {"last_epoch": update}},
                               required_components=["model", "scheduler", "rng"],
                               s3_client=s3, staging_dir=str(tmp_path)) is not None
    key = next(o["Key"] for o in s3.list_objects_v2(Bucket="fallback", Prefix="run/g60/model/")
               ["Contents"] if o["Key"].endswith(".distcp"))
    s3.put_object(Bucket="fallback", Key=key, Body=b"cut")  # replaced by a short object
    events = Events()
    model = torch.nn.Linear(4, 1)
    sd = model.state_dict()
    out = load_generation(loc, "g60", state={"model": sd}, client=events, restore_rng=False,
                          s3_client=s3, staging_dir=str(tmp_path))
    assert (out.generation_id, out.update, out["scheduler"]) == ("g40", 40, {"last_epoch": 40})
    assert float(sd["weight"][0, 0]) == 4.0
    assert events.sent[0][:3] == ("restore_failed", "g60", "object_damaged")
    assert f"s3://fallback/{key}" in events.sent[0][3]
    assert events.sent[1] == ("restore_completed", "g40")
