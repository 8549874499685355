"""The drill's parts without launching a trainer: the fault variable, the comparison of
sequences and states, the lineage, corrupting a committed generation, the printed table, and a
loader with workers resuming at a cursor (the bug the read-cursor drill found)."""

from __future__ import annotations

import json

import pytest

from recoverydash.recovery import drills as core
from recoverydash.sdk import drill, faults
from recoverydash.sdk.faults import Fault


def line(update, rank, positions, digest="d", attempt=0, fp=None):
    return {"kind": "update", "update": update, "rank": rank, "attempt": attempt,
            "consumed": [["main", 0, p] for p in positions], "digest": digest,
            "fingerprint": fp or [[1.0, 2.0]], "t": float(update)}


def test_it_parses_the_fault_variable_and_names_what_it_expected():
    f = Fault.parse("during_shard@4/1")
    assert (f.point, f.update, f.rank, str(f)) == ("during_shard", 4, 1, "during_shard@4/1")
    assert Fault.parse("kill@5").rank is None
    assert str(Fault.parse("before_commit@2/all")) == "before_commit@2/all"
    with pytest.raises(ValueError, match=r"<point>@<update>\[/<rank>\|/all\]"):
        Fault.parse("before_commit")
    with pytest.raises(ValueError, match="unknown point 'sideways'"):
        Fault.parse("sideways@3")


def test_it_takes_the_resumed_launchs_updates_over_the_rolled_back_ones():
    first = [line(1, 0, [0, 2]), line(2, 0, [4, 6]), line(3, 0, [8, 10], digest="lost")]
    second = [line(3, 0, [8, 10], digest="again", attempt=1), line(4, 0, [12, 14], attempt=1)]
    seq = drill.lineage(first, second)
    assert sorted(seq) == [(1, 0), (2, 0), (3, 0), (4, 0)]
    assert seq[(3, 0)]["digest"] == "again"


def test_it_names_the_first_divergence_by_update_rank_and_index():
    control = drill.updates_of([line(1, 0, [0, 2]), line(1, 1, [1, 3]), line(2, 0, [4, 6]),
                                line(2, 1, [5, 7])])
    same = dict(control)
    assert core.first_divergence(control, same) is None
    skipped = dict(control)
    skipped[(2, 1)] = line(2, 1, [5, 9])
    assert core.first_divergence(control, skipped) == {
        "update": 2, "rank": 1, "index": 1, "control": ["main", 0, 7], "drill": ["main", 0, 9]}
    missing = {k: v for k, v in control.items() if k != (2, 0)}
    assert core.first_divergence(control, missing) == {
        "update": 2, "rank": 0, "index": 0, "control": ["main", 0, 4], "drill": None}
    assert drill.divergence_text(core.first_divergence(control, skipped)) == \
        "u2 r1 #1: main:e0:7 vs main:e0:9"


def test_it_compares_the_state_exactly_or_within_the_tolerance():
    control = drill.updates_of([line(u, 0, [u], digest=f"d{u}", fp=[[float(u), 1.0]])
                                for u in range(1, 6)])
    resumed = drill.updates_of([line(u, 0, [u], digest=f"d{u}", fp=[[float(u), 1.0]])
                                for u in range(3, 6)])
    assert core.compare_state(control, resumed, 3, 5, None) == (True, None, 3)
    resumed[(4, 0)] = line(4, 0, [4], digest="other", fp=[[4.0 + 1e-9, 1.0]])
    assert core.compare_state(control, resumed, 3, 5, None) == (False, 4, 1)
    assert core.compare_state(control, resumed, 3, 5, 1e-6) == (True, None, 3)
    resumed[(4, 0)] = line(4, 0, [4], digest="other", fp=[[4.1, 1.0]])
    assert core.compare_state(control, resumed, 3, 5, 1e-6) == (False, 4, 1)
    assert core.compare_state(control, {}, 3, 5, None) == (False, 3, 0)


def test_it_flips_one_byte_of_the_newest_generations_largest_object(tmp_path):
    from recoverydash.checkpoints import objects as storage

    for update in (2, 4):
        gen = tmp_path / f"g{update}"
        gen.mkdir()
        (gen / "big.bin").write_bytes(b"\x00" * 10)
        (gen / "small.bin").write_bytes(b"\x01" * 2)
        digest = storage.sha256_file(str(gen / "big.bin"))[0]
        storage.write_manifest_atomically(str(tmp_path), {
            "schema_revision": 1, "generation_id": f"g{update}", "update": update,
            "objects": [{"uri": storage.file_uri(str(gen / "big.bin")), "size": 10,
                         "sha256": digest, "shard": "rank0", "component": "model"},
                        {"uri": storage.file_uri(str(gen / "small.bin")), "size": 2,
                         "shard": "rank0", "component": "rng"}]})
    done = drill.corrupt_newest(str(tmp_path))
    assert done["generation_id"] == "g4" and done["offset"] == 5
    assert (tmp_path / "g4" / "big.bin").read_bytes() == b"\x00" * 5 + b"\xff" + b"\x00" * 4
    assert (tmp_path / "g2" / "big.bin").read_bytes() == b"\x00" * 10
    assert [m["generation_id"] for m in drill.manifests(str(tmp_path))] == ["g4", "g2"]


def test_it_prints_one_row_per_crash_point_and_says_why_a_drill_failed():
    report = {"drill_id": "d1", "config_digest": "abc", "updates": 8, "at": 4, "kill": "all",
              "state_compare": "exact: sha256 of the parameters", "control": {"run_id": "c"},
              "passed": False, "drills": [
                  {"point": "before_commit", "restored": "g2", "expected": "g2",
                   "server": {"verdict": "omission", "replayed": 0, "omitted": 16,
                              "recomputed": 16},
                   "first_divergence": {"update": 3, "rank": 0, "index": 0,
                                        "control": ["main", 0, 32], "drill": ["main", 0, 48]},
                   "state": {"match": False, "first_mismatch": 3, "updates_compared": 0},
                   "cost": {"restore_seconds": 0.25}, "passed": False,
                   "failures": ["the consumed sequence diverges from the control's"]}]}
    text = drill.table(report)
    rows = text.splitlines()
    assert rows[1].split() == ["crash", "point", "restored", "verdict", "r/o/c", "first",
                               "divergence", "state", "restore", "s", "result"]
    assert rows[3].split() == ["before_commit", "g2", "omission", "0/16/16", "u3", "r0", "#0:",
                               "main:e0:32", "vs", "main:e0:48", "differs", "at", "u3", "0.250",
                               "FAIL"]
    assert rows[-2] == "before_commit: the consumed sequence diverges from the control's"
    assert rows[-1] == "DRILL FAILED"


def test_it_traces_nothing_and_injects_nothing_without_its_variables(monkeypatch, tmp_path):
    monkeypatch.delenv(faults.TRACE_ENV, raising=False)
    faults.trace("update", update=1)
    assert faults.active_fault() is None
    faults.save_point("before_commit", "g", 4, 0, coordinator=True)  # returns: no fault
    monkeypatch.setenv(faults.TRACE_ENV, str(tmp_path))
    faults.trace("restore", generation_id="g2", seconds=0.5, rank=0)
    (f,) = list(tmp_path.iterdir())
    (doc,) = [json.loads(x) for x in f.read_text().splitlines()]
    assert {k: doc[k] for k in ("kind", "generation_id", "seconds", "rank")} == {
        "kind": "restore", "generation_id": "g2", "seconds": 0.5, "rank": 0}


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_it_resumes_a_loader_with_workers_at_the_cursor(workers):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler, TensorDataset

    import recoverydash.sdk as rd
    from recoverydash.integrations.pytorch import observed_loader
    from recoverydash.sdk.observe import strip

    rec = rd.ObservedRecorder(rd.Client(None, None, "x", attempt=0), rank=0, world_size=2)
    data = TensorDataset(torch.arange(96.0).unsqueeze(1))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
    loader = observed_loader(rec, data, sampler=sampler, batch_size=4, num_workers=workers,
                             **({"prefetch_factor": 2} if workers else {}))
    rec.load_state_dict({"cursor": [{"stratum": "main", "epoch": 0, "position": 48}]})
    first = [strip(b)[1].groups[0][1] for b in loader]
    # a DataLoader with workers creates its sampler iterator twice: the skip is not lost
    assert first[0] == range(48, 56, 2) and first[-1] == range(88, 96, 2) and len(first) == 6


def test_it_expects_the_newest_committed_generation_but_not_a_corrupted_one():
    ms = [{"generation_id": "g2", "update": 2, "committed_at": "a"},
          {"generation_id": "g4", "update": 4, "committed_at": "b"}]
    assert core.expected_generation(ms)["generation_id"] == "g4"
    assert core.expected_generation(ms, corrupted="g4")["generation_id"] == "g2"
    assert core.expected_generation(ms[:1], corrupted="g2") is None


def test_it_lists_every_reason_a_drill_fails_its_contract():
    ok = {"point": "before_commit", "crash": {"reached": True, "returncode": -9},
          "resume": {"returncode": 0}, "restored": "g2", "expected": "g2",
          "first_divergence": None, "state": {"match": True}, "server": {"verdict": "exact"}}
    assert core.drill_failures(ok) == []
    assert core.drill_failures({**ok, "server": None}) == []  # the server not asked
    bad = {**ok, "crash": {"reached": False}, "restored": "g0",
           "first_divergence": {"update": 3}, "state": {"match": False, "first_mismatch": 3},
           "server": {"verdict": "omission"}}
    assert core.drill_failures(bad) == [
        "the crash point was not reached (no fault in the trace)",
        "restored g0, the rules say g2", "the consumed sequence diverges from the control's",
        "the state after the resume differs from the control's",
        "the server's verdict is 'omission'"]


def test_a_generation_still_undecided_when_the_wait_expired_is_a_warning_not_a_failure():
    # after_commit on a loaded machine: u4's manifest is in storage, the server has not verified
    # it when the resumed launch's wait of 60 s expired, and names u2, the newest restorable then
    plan = {"source": "server", "generation_id": "u2", "wait_undecided_s": 60.0,
            "newer_undecided": [{"generation_id": "u4", "update": 4, "status": "committed"}]}
    assert core.expected_at_restore("u4", plan) == ("u2", (
        "the rules restore u4, which the server had not decided yet (committed) when the "
        "resumed launch's wait of 60 s expired; it named u2, the newest restorable then"))
    ok = {"point": "after_commit", "crash": {"reached": True, "returncode": -9},
          "resume": {"returncode": 0}, "restored": "u2", "expected": "u4",
          "expected_at_restore": "u2", "first_divergence": None, "state": {"match": True},
          "server": {"verdict": "exact"}}
    assert core.drill_failures(ok) == []
    # a trainer that restores anything else still fails, named against what could be known
    assert core.drill_failures({**ok, "restored": None}) == ["restored None, the rules say u2"]
    # the server had decided (u4 not listed as undecided), named u2 all the same: the rules'
    # u4 stands; and a plan from storage, or one naming u4, changes nothing
    assert core.expected_at_restore("u4", {**plan, "newer_undecided": []}) == ("u4", None)
    assert core.expected_at_restore("u4", {**plan, "source": "storage"}) == ("u4", None)
    assert core.expected_at_restore("u4", {**plan, "generation_id": "u4"}) == ("u4", None)
    assert core.expected_at_restore("u4", None) == ("u4", None)


def test_the_table_says_the_wait_and_a_difference_from_the_rules_as_a_warning():
    report = {"drill_id": "d1", "config_digest": "abc", "updates": 8, "at": 4, "kill": "all",
              "wait_undecided_s": 60.0, "state_compare": "exact: sha256 of the parameters",
              "control": {"run_id": "c"}, "passed": True, "drills": [
                  {"point": "after_commit", "restored": "u2", "expected": "u4",
                   "expected_at_restore": "u2", "warnings": ["u4 was not decided"],
                   "server": {"verdict": "exact", "replayed": 0, "omitted": 0,
                              "recomputed": 32},
                   "first_divergence": None,
                   "state": {"match": True, "first_mismatch": None, "updates_compared": 6},
                   "cost": {"restore_seconds": 0.25}, "passed": True, "failures": []}]}
    rows = drill.table(report).splitlines()
    assert rows[0] == ("drill d1 (trainer abc, 8 updates, crash at generation >= u4, kill all, "
                       "undecided wait up to 60 s; state exact: sha256 of the parameters; loss "
                       "not compared)")
    assert rows[3].split()[:5] == ["after_commit", "u2", "(rules:", "u4,", "undecided"]
    assert rows[3].split()[-1] == "pass"
    assert rows[-2:] == ["after_commit: warning: u4 was not decided", "all drills passed"]


def test_the_drills_launches_wait_for_undecided_generations(tmp_path, monkeypatch):
    from recoverydash.sdk.restore import WAIT_UNDECIDED_ENV

    seen = {}

    class Proc:
        pid = 0

        def __init__(self, cmd, env, **kw):
            seen["env"] = env

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(drill.subprocess, "Popen", Proc)
    opts = drill.DrillOptions(command=["true"], updates=8, at=4, location=str(tmp_path),
                              env={}, wait_undecided_s=45.0)
    drill._launch(opts, "r", str(tmp_path), str(tmp_path / "t"), str(tmp_path / "l.log"), None,
                  "control", "d1")
    assert seen["env"][WAIT_UNDECIDED_ENV] == "45"
    assert drill.DrillOptions(command=[], updates=1, at=1,
                              location="x").wait_undecided_s == 60.0


def test_it_looks_up_a_framework_save_s_manifest_beside_the_framework_s_folder():
    """A pending generation's manifest (commit the server never heard of): beside the folder
    named after it (save_generation), else beside the framework's files (publish_files: HF's
    checkpoint-N/, Lightning's .ckpt keep it in <output_dir>/<generation_id>/)."""
    from recoverydash.ingest.discovery import _manifest_candidates

    m = "recoverydash-manifest.json"
    assert _manifest_candidates("s3://b/p/u4/model/a.distcp", "u4") == [f"s3://b/p/u4/{m}"]
    assert _manifest_candidates("file:///x/run/checkpoint-4/model.safetensors", "u4") == [
        f"file:///x/run/checkpoint-4/u4/{m}", f"file:///x/run/u4/{m}", f"file:///x/u4/{m}"]
    assert _manifest_candidates("file:///x/run/epoch=0-step=4.ckpt", "u4")[0] == \
        f"file:///x/run/u4/{m}"
    assert _manifest_candidates(None, "u4") == []


# --- sample identities (issue 25: a drill compares the ids each rank received) ----------------

def idline(update, rank, positions, ids, digest="d", attempt=0):
    return {**line(update, rank, positions, digest, attempt), "ids": core.compact_ids(ids)}


def test_the_trace_keeps_the_sample_ids_in_order_compactly():
    items = core.compact_ids([0, 1, 2, 3, 7, 9, 5, 3, 1, 1, "a", True])
    assert items == [[0, 4], 7, 9, [5, -1, -2], 1, "a", "True"]
    assert core.expand_ids(items) == [0, 1, 2, 3, 7, 9, 5, 3, 1, 1, "a", "True"]
    assert core.compact_ids([4, 4, 4, 10, 20, 30]) == [4, 4, 4, [10, 40, 10]]
    with pytest.raises(ValueError, match="not a sample id"):
        core.expand_ids([[1, 2, 3, 4]])


def test_the_trace_records_the_ids_the_recorder_already_has(monkeypatch, tmp_path):
    """A real ObservedRecorder over a shuffled DistributedSampler: the trace's ``ids`` are the
    dataset indices of the batches committed (the tags' ids, not recomputed)."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler, TensorDataset

    import recoverydash.sdk as rd
    from recoverydash.integrations.pytorch import observed_loader

    monkeypatch.setenv(faults.TRACE_ENV, str(tmp_path))
    monkeypatch.setattr(faults, "_trace_fd", None)  # a trace file of this process's own
    rec = rd.ObservedRecorder(rd.Client(None, None, "x", attempt=0), rank=1, world_size=2)
    data = TensorDataset(torch.arange(16.0).unsqueeze(1))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = observed_loader(rec, data, sampler=sampler, batch_size=4)
    got = []
    for u, batch in enumerate(loader, start=1):
        x = rec.observe(batch)[0]
        got.append([int(v) for v in x.view(-1)])  # the sample values are their indices
        rec.commit(u)
    docs = [json.loads(x) for f in tmp_path.iterdir() for x in f.read_text().splitlines()]
    ups = sorted((d for d in docs if d["kind"] == "update"), key=lambda d: d["update"])
    assert [core.expand_ids(d["ids"]) for d in ups] == got
    assert [p[2] for p in ups[0]["consumed"]] == [1, 3, 5, 7]  # rank 1 of 2: positions 1, 3, ..
    assert sorted(got[0] + got[1]) == sorted(list(sampler))


def test_other_samples_at_the_same_positions_are_a_data_divergence_not_a_state_failure():
    """The resumed launch's sampler drew another order (another seed): the same positions 8..11
    hold other samples. The drill names the data and does not blame the restored state."""
    control = drill.updates_of([idline(1, 0, [0, 1], [5, 2]), idline(2, 0, [2, 3], [7, 0]),
                                idline(3, 0, [4, 5], [3, 6], digest="c3"),
                                idline(4, 0, [6, 7], [1, 4], digest="c4")])
    resumed = drill.updates_of([idline(3, 0, [4, 5], [4, 3], digest="r3", attempt=1),
                                idline(4, 0, [6, 7], [6, 2], digest="r4", attempt=1)])
    seq = core.drill_lineage(control, resumed)
    assert core.first_divergence(control, seq) is None  # the positions cannot see it
    assert core.ids_recorded(control, seq)
    data = core.data_divergence(control, seq)
    assert data == {"update": 3, "rank": 0, "control_only": [6], "drill_only": [4],
                    "positions_equal": True}
    state = {"match": False, "first_mismatch": 3, "updates_compared": 0}
    result = {"point": "before_commit", "crash": {"reached": True, "returncode": -9},
              "resume": {"returncode": 0}, "restored": "g2", "expected": "g2",
              "first_divergence": None, "ids_recorded": True, "data_divergence": data,
              "state": state, "server": None}
    assert core.drill_failures(result) == [
        "at update 3 rank 0 received samples {4} where the uninterrupted run received {6}: the "
        "data stream diverged (same positions, other samples: the order changed); the "
        "parameters differ from update 3 on, which the data explains: whether the model state "
        "was restored correctly is unverified (no update after the resume came before the "
        "divergence)"]
    # the state matched for 2 updates after the resume before the data diverged at update 5
    later = {**data, "update": 5}
    assert core.drill_failures({**result, "data_divergence": later, "state": {
        "match": False, "first_mismatch": 5, "updates_compared": 2}}) == [
        "at update 5 rank 0 received samples {4} where the uninterrupted run received {6}: the "
        "data stream diverged (same positions, other samples: the order changed); the model "
        "state was restored correctly (the parameters matched the control's for 2 update(s) "
        "after the resume)"]
    # a state that differs before the data diverged is blamed as before
    assert core.drill_failures({**result, "data_divergence": later, "state": {
        "match": False, "first_mismatch": 4, "updates_compared": 1}})[1] == \
        "the state after the resume differs from the control's"
    assert drill.divergence_text(None, data, True) == \
        "u3 r0 samples: 1 only in control, 1 only here"


def test_the_same_samples_at_other_positions_are_no_divergence_and_a_replay_is_one():
    control = drill.updates_of([idline(1, 0, [0, 1], [5, 2]), idline(1, 1, [0, 1], [9, 8]),
                                idline(2, 0, [2, 3], [7, 0]), idline(2, 1, [2, 3], [1, 3])])
    renumbered = drill.updates_of([idline(1, 0, [0, 1], [5, 2]), idline(1, 1, [0, 1], [9, 8]),
                                   idline(2, 0, [12, 13], [0, 7]),
                                   idline(2, 1, [2, 3], [1, 3])])
    assert core.first_divergence(control, renumbered)["update"] == 2
    assert core.data_divergence(control, renumbered) is None
    assert core.reordered(control, renumbered) == [(2, 0)]
    assert drill.divergence_text(core.first_divergence(control, renumbered), None, True) == \
        "none (positions renumbered)"
    ok = {"point": "before_commit", "crash": {"reached": True, "returncode": -9},
          "resume": {"returncode": 0}, "restored": "g2", "expected": "g2",
          "first_divergence": core.first_divergence(control, renumbered), "ids_recorded": True,
          "data_divergence": None, "state": {"match": True}, "server": None}
    assert core.drill_failures(ok) == []
    # rank 1 of update 2 fed sample 9 again instead of 3 (a replay and an omission), and the
    # resumed launch never reached update 3 that the control has
    control[(3, 0)] = idline(3, 0, [4, 5], [4, 6])
    replay = {**renumbered, (2, 1): idline(2, 1, [2, 3], [1, 9])}
    assert core.data_divergence(control, replay) == {
        "update": 2, "rank": 1, "control_only": [3], "drill_only": [9],
        "positions_equal": True}
    assert core.data_divergence(control, renumbered) == {
        "update": 3, "rank": 0, "control_only": [4, 6], "drill_only": [],
        "positions_equal": False}


def test_without_ids_the_positions_decide_and_the_failure_says_so():
    control = drill.updates_of([line(1, 0, [0, 2]), line(2, 0, [4, 6])])
    drilled = drill.updates_of([line(1, 0, [0, 2]), line(2, 0, [0, 2])])
    assert not core.ids_recorded(control, drilled)
    assert core.reordered(control, drilled) == []
    with pytest.raises(ValueError, match="not recorded"):
        core.data_divergence(control, drilled)
    first = core.first_divergence(control, drilled)
    result = {"point": "before_commit", "crash": {"reached": True, "returncode": -9},
              "resume": {"returncode": 0}, "restored": "g2", "expected": "g2",
              "first_divergence": first, "ids_recorded": False, "data_divergence": None,
              "state": {"match": False, "first_mismatch": 2}, "server": None}
    assert core.drill_failures(result) == [
        "the consumed sequence diverges from the control's (sample ids were not recorded: "
        "whether other samples were received or the same ones at other positions is unknown)",
        "the state after the resume differs from the control's"]
    assert drill.divergence_text(first, None, False) == \
        "u2 r0 #0: main:e0:4 vs main:e0:0 (ids not recorded)"
