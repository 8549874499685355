"""Failure drills: ``python -m recoverydash.sdk drill [options] -- <training command>``.

A drill proves a trainer's recovery on a disposable run before an expensive failure does. It
runs the user's command (torchrun or python; the plain SDK or an integration) several times:

1. a **control** run of U updates, uninterrupted;
2. one **drill** run per crash point, crashed by the SDK itself at a step of the checkpoint
   publication protocol (``recoverydash.sdk.faults``: ``before_shards``, ``during_shard``,
   ``before_commit``, ``after_commit`` of the first generation saved at an update ``>= --at``)
   or, for ``corrupt_after_commit``, killed after update ``--kill-at`` and one byte of the
   newest committed generation's largest object flipped (same size: only its sha256 tells);
   then launched again with the same command, which must resume and reach U.

The command names its run and checkpoint folder with placeholders the drill fills in per run:
``{run_id}`` (``<drill_id>-control``, ``<drill_id>-<crash point>``), ``{location}``
(``<--location>/<run_id>``) and ``{updates}`` (U); the same values are in the environment as
``RECOVERYDASH_DRILL_RUN_ID``, ``RECOVERYDASH_DRILL_LOCATION``, ``RECOVERYDASH_DRILL_UPDATES``.
No change to the script: the crash points and the trace are switched on by environment
variables the SDK reads (``RECOVERYDASH_DRILL_FAULT``, ``RECOVERYDASH_DRILL_TRACE``; the
trace records per update and rank the ``[stratum, epoch, position]`` consumed and a sha256 of
the parameters of every optimizer after its step).

Per drill run, against the control (``compare``):

- ``crash``: whether the named step was reached (a ``fault`` line of that point in the crashed
  launch's trace; ``reached`` False says the crash did not happen where it was injected) and on
  which ``ranks``;
- ``restored`` (the generation the resumed launch loaded, from its trace) against ``expected``,
  the one the rules say: the newest generation whose commit marker (manifest) is in storage
  after the crash, except the corrupted one (a generation without its marker is never
  restorable; one committed in storage is, even when the server never heard of the commit),
  and ``plan``: what the resumed launch's ``restore_plan`` answered (source, generation, the
  generations a server refused with their status, the newer ones it had not decided yet when
  its wait expired), named in the failure when the two differ. The launches' ``restore_plan``
  waits for newer generations the server has not decided yet, as a careful trainer would
  (``--wait-undecided``, default 60 s, at most 600, printed in the report's first line); when
  the server still had not decided the rules' generation when that wait expired and named the
  newest restorable then, that one is ``expected_at_restore`` and the difference a warning,
  not a failure (``recovery.drills.expected_at_restore``);
- ``first_divergence``: the first ``(update, rank, index)`` at which the sequence of positions
  consumed by the lineage (each update as last recorded: the resumed launch's updates replace
  the crashed launch's rolled-back ones) differs from the control's, or None;
- ``ids_recorded`` and ``data_divergence``: whether every update of both sides traced the sample
  ids each rank received and, when it did, the first ``(update, rank)`` whose multiset of ids
  differs from the control's (``control_only``, ``drill_only``, ``positions_equal``), or None.
  With the ids, the data decides: positions that differ over the same samples are a warning
  (renumbered), other samples at the same positions (an order changed: seed, world size,
  sampler) a failure named as a divergence of the data, and a state that first differs at or
  after the data's divergence is not blamed on the restore (``recovery.drills.drill_failures``).
  Without them the positions decide, as before, and the failure says the ids were not recorded;
- the state after the resume, update by update for ``--compare-updates`` K updates (default:
  every update up to U): ``exact`` compares the sha256 of the parameters; ``--tolerance T``
  compares each parameter tensor's sum and L2 norm within a relative and absolute tolerance T
  (bitwise equality is not promised across kernels); ``first_state_mismatch`` is the first
  update whose parameters differ;
- the server's verdict of the restart (replayed, omitted, recomputed; ``/api/v1/runs/{run}/
  recovery``) when ``--url`` and ``--token`` are given;
- the cost: ``lost_updates`` (updates the crashed launch completed beyond the restored one),
  ``lost_seconds`` (trainer clock from the restored update's commit to the crash),
  ``restore_seconds`` (``load_generation``, the slowest rank; over the HF and Lightning
  integrations the seconds ``resume_checkpoint`` took to choose and verify the checkpoint: the
  framework's own load is not timed), ``fast_forward_seconds`` (from the loader restored at
  its cursor to the first batch recorded, the slowest rank; None when the loader was not
  restored through the recorder: HF Trainer's ``skip_first_batches``, Lightning restoring a
  ``StatefulDataLoader``'s state) and the wall seconds of each launch.

The crash points fire on both save paths: ``save_generation`` and ``publish_files`` (files a
framework wrote itself; ``before_shards`` then fires in the integration, where the save is
announced): ``recoverydash.sdk.faults`` says where each one fires.

A drill passes its contract when the crash happened where it was injected, the resume reached U,
the restored generation is the expected one, the data has no divergence (the samples with the
ids recorded, else the positions), the state matches
for the K updates, and (when the server was asked) the verdict is ``exact``. The exit status is
0 when every drill passes, 1 otherwise, 2 on usage errors; the report is printed as a table and
written as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from recoverydash.checkpoints import objects as storage
from recoverydash.recovery.drills import (
    CRASH_POINTS,
    compare_state,
    data_divergence,
    drill_failures,
    drill_lineage,
    expected_at_restore,
    expected_generation,
    first_divergence,
    ids_recorded,
    reordered,
)
from recoverydash.sdk.faults import FAULT_ENV, TRACE_ENV
from recoverydash.sdk.restore import WAIT_UNDECIDED_ENV

REPORT_FORMAT = 1
#: Seconds a drill's launches let ``restore_plan`` wait for newer generations the server has not
#: decided yet (``--wait-undecided``; ``$RECOVERYDASH_WAIT_UNDECIDED_S`` in their environment):
#: a careful trainer's wait, so a drill judges against what could be known at the restore ...
DRILL_WAIT_UNDECIDED_S = 60.0
#: ... and at most this many (the server's own bound on waiting for one,
#: ``RECOVERYDASH_UNDECIDED_BOUND_S``, by default).
MAX_WAIT_UNDECIDED_S = 600.0


@dataclass
class DrillOptions:
    """What to drill. command: the training command with ``{run_id}``, ``{location}``,
    ``{updates}`` placeholders. updates: U. at: the update at or after which the faulted
    generation is saved. kill: ``"all"`` or a rank (the rank SIGKILLed). kill_at: the update
    after which ``corrupt_after_commit`` kills (default ``at + 1``). compare_updates: K (None:
    up to U). tolerance: None for exact digests. location: the base checkpoint folder. workdir:
    traces and logs (default ``<location>/.drill-<drill_id>``). wait_undecided_s: seconds the
    launches' ``restore_plan`` waits for newer generations not decided yet (0 to
    :data:`MAX_WAIT_UNDECIDED_S`)."""

    command: list[str]
    updates: int
    at: int
    location: str
    points: tuple[str, ...] = CRASH_POINTS
    kill: str = "all"
    kill_at: int | None = None
    compare_updates: int | None = None
    tolerance: float | None = None
    drill_id: str | None = None
    url: str | None = None
    token: str | None = None
    workdir: str | None = None
    timeout: float = 900.0
    analysis_timeout: float = 120.0
    env: dict[str, str] | None = None
    cwd: str | None = None
    echo: bool = True
    wait_undecided_s: float = DRILL_WAIT_UNDECIDED_S


@dataclass
class Launch:
    """One launch of the command: exit status, wall seconds, its trace lines and log file."""

    returncode: int
    seconds: float
    lines: list[dict] = field(default_factory=list)
    log: str = ""


def config_digest(command: list[str]) -> str:
    """The trainer's identity in drill reports: sha256 (first 16 hex digits) of the command
    template as JSON (placeholders unfilled, so every drill of one command shares it)."""
    return hashlib.sha256(json.dumps(command).encode()).hexdigest()[:16]


def new_drill_id() -> str:
    """``drill-<UTC yyyymmddThhmmss>-<4 hex>``: a run-id prefix (the run ids append a role)."""
    return time.strftime("drill-%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def read_trace(folder: str) -> list[dict]:
    """Every line of the trace files under ``folder`` (a torn last line is skipped), by time."""
    out: list[dict] = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            for raw in f:
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    continue
    out.sort(key=lambda d: d.get("t", 0))
    return out


def _fill(command: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for arg in command:
        for k, v in values.items():
            arg = arg.replace("{" + k + "}", v)
        out.append(arg)
    return out


def _launch(opts: DrillOptions, run_id: str, location: str, trace_dir: str, log_path: str,
            fault: str | None, role: str, drill_id: str) -> Launch:
    env = dict(os.environ if opts.env is None else opts.env)
    for k in (FAULT_ENV, TRACE_ENV):
        env.pop(k, None)
    env.update({TRACE_ENV: trace_dir, WAIT_UNDECIDED_ENV: f"{opts.wait_undecided_s:g}",
                "RECOVERYDASH_DRILL_ID": drill_id,
                "RECOVERYDASH_DRILL_ROLE": role, "RECOVERYDASH_DRILL_RUN_ID": run_id,
                "RECOVERYDASH_DRILL_LOCATION": location,
                "RECOVERYDASH_DRILL_UPDATES": str(opts.updates)})
    if fault:
        env[FAULT_ENV] = fault
    cmd = _fill(opts.command, {"run_id": run_id, "location": location,
                               "updates": str(opts.updates)})
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, env=env, cwd=opts.cwd, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            logf.write(f"\n[drill] killed after {opts.timeout} s\n".encode())
    return Launch(rc, round(time.monotonic() - t0, 3), read_trace(trace_dir), log_path)


# --- reading traces ------------------------------------------------------------------------------

def updates_of(lines: list[dict]) -> dict[tuple[int, int], dict]:
    """``{(update, rank): line}`` of the ``update`` lines (a later line wins)."""
    return {(d["update"], d["rank"]): d for d in lines if d.get("kind") == "update"}


def lineage(first: list[dict], second: list[dict]) -> dict[tuple[int, int], dict]:
    """The updates of the run's lineage from the two launches' trace lines
    (``recovery.drills.drill_lineage``)."""
    return drill_lineage(updates_of(first), updates_of(second))


# --- storage -------------------------------------------------------------------------------------

def manifests(location: str) -> list[dict]:
    """Every readable manifest committed under ``location``, newest update first (an unreadable
    one is no commit marker; a location that cannot be listed has none)."""
    out = []
    try:
        uris = storage.list_manifests(location)
    except storage.StorageError:
        return []
    for uri in uris:
        try:
            out.append(storage.read_manifest(uri))
        except storage.StorageError:
            pass
    out.sort(key=lambda m: (m.get("update") or -1, m.get("committed_at") or ""), reverse=True)
    return out


def corrupt_newest(location: str) -> dict | None:
    """Flip one byte in the middle of the largest object of the newest committed generation
    (its size unchanged: only the sha256 tells). Returns ``{"generation_id", "uri", "offset"}``
    or None when nothing is committed."""
    ms = manifests(location)
    if not ms:
        return None
    m = ms[0]
    objs = [o for o in m.get("objects") or [] if o.get("size")]
    if not objs:
        return None
    obj = max(objs, key=lambda o: o["size"])
    uri = obj["uri"]
    if "://" not in uri:
        uri = storage.join_uri(location, m["generation_id"], uri)
    path = storage.parse_uri(uri).path
    offset = obj["size"] // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    return {"generation_id": m["generation_id"], "uri": uri, "offset": offset}


# --- the server ----------------------------------------------------------------------------------

def _get(url: str, token: str, path: str, timeout: float = 30.0) -> Any:
    req = urllib.request.Request(url.rstrip("/") + path,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def server_verdict(url: str | None, token: str | None, run_id: str,
                   timeout: float) -> dict | None:
    """The server's verdict of the run's last restart once its analysis is current (polled up
    to ``timeout`` seconds): ``{"verdict", "replayed", "omitted", "recomputed", "resumed_from",
    "lost_updates", "pending"}``; ``{"error": ...}`` when the server cannot say; None without
    a server."""
    if not url or not token:
        return None
    deadline = time.monotonic() + timeout
    path = f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}/recovery"
    while True:
        try:
            report = _get(url, token, path)
        except (urllib.error.URLError, OSError, ValueError) as e:
            if time.monotonic() > deadline:
                return {"error": repr(e)[:300]}
            time.sleep(1.0)
            continue
        restarts = report.get("restarts") or []
        settled = restarts and restarts[-1].get("verdict") != "unverified"
        if (not report.get("pending_analysis") and settled) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not restarts:
        return {"error": "the server knows no restart of this run",
                "pending": bool(report.get("pending_analysis"))}
    r = restarts[-1]
    return {k: r.get(k) for k in ("verdict", "replayed", "omitted", "recomputed",
                                  "resumed_from", "lost_updates")} | \
        {"pending": bool(report.get("pending_analysis"))}


# --- one drill -----------------------------------------------------------------------------------

def _max_by_rank(lines: list[dict], kind: str, key: str) -> float | None:
    vals = [float(v) for d in lines if d.get("kind") == kind and (v := d.get(key)) is not None]
    return max(vals) if vals else None


def _fast_forward(lines: list[dict]) -> float | None:
    """Slowest rank's seconds from ``resume`` (loader restored) to its ``first_batch``."""
    out = None
    for r in {d.get("rank") for d in lines if d.get("kind") == "resume"}:
        resume = next((d["t"] for d in lines if d.get("kind") == "resume" and d["rank"] == r),
                      None)
        first = next((d["t"] for d in lines if d.get("kind") == "first_batch"
                      and d["rank"] == r), None)
        if resume is not None and first is not None:
            out = max(out or 0.0, round(first - resume, 3))
    return out


def _fault_of(opts: DrillOptions, point: str) -> str:
    """The fault a crash point's first launch runs with (``RECOVERYDASH_DRILL_FAULT``)."""
    if point == "corrupt_after_commit":
        return f"kill@{opts.kill_at if opts.kill_at is not None else opts.at + 1}/{opts.kill}"
    return f"{point}@{opts.at}/{opts.kill}"


def _crash_of(first: Any, faults_seen: list[dict]) -> dict:
    """What the first launch did: its exit, whether the fault fired, where."""
    return {"returncode": first.returncode, "seconds": first.seconds,
            "reached": bool(faults_seen), "log": first.log,
            "ranks": sorted({d.get("rank") for d in faults_seen
                             if isinstance(d.get("rank"), int)}),
            "generation_id": next((d.get("generation_id") for d in faults_seen), None),
            "update": next((d.get("update") for d in faults_seen), None)}


def _state_of(opts: DrillOptions, control: dict, resumed: dict[tuple[int, int], dict],
              restored_update: int | None) -> dict:
    """The resumed run's parameters against the control's, update by update."""
    if restored_update is None:
        return {"match": False, "first_mismatch": None, "updates_compared": 0}
    last = opts.updates if opts.compare_updates is None else \
        min(opts.updates, restored_update + opts.compare_updates)
    match, mismatch, n = compare_state(control, resumed, restored_update + 1, last,
                                       opts.tolerance)
    return {"match": match, "first_mismatch": mismatch, "updates_compared": n}


def _cost_of(first: Any, second: Any, faults_seen: list[dict],
             restored_update: int | None) -> dict:
    """What the crash cost: updates and seconds lost, restore and fast-forward seconds."""
    top = max((u for u, _ in updates_of(first.lines)), default=0)
    ru = restored_update if restored_update is not None else 0
    at_restored = [d["t"] for d in first.lines if d.get("kind") == "update"
                   and d["update"] == ru]
    t_fault = faults_seen[0]["t"] if faults_seen else None
    t_from = min(at_restored) if at_restored else min((d["t"] for d in first.lines), default=None)
    return {"lost_updates": max(0, top - ru),
            "lost_seconds": round(t_fault - t_from, 3) if t_fault and t_from else None,
            "restore_seconds": _max_by_rank(second.lines, "restore", "seconds"),
            "fast_forward_seconds": _fast_forward(second.lines),
            "crash_launch_seconds": first.seconds, "resume_launch_seconds": second.seconds}


def run_point(opts: DrillOptions, point: str, drill_id: str, workdir: str,
              control: dict) -> dict:
    """Run one crash point (two launches) and compare it with the control's updates."""
    run_id = f"{drill_id}-{point.replace('_', '-')}"
    location = os.path.join(opts.location, run_id)
    fault = _fault_of(opts, point)
    res: dict[str, Any] = {"point": point, "run_id": run_id, "fault": fault}
    first = _launch(opts, run_id, location, os.path.join(workdir, run_id, "launch1"),
                    os.path.join(workdir, run_id, "launch1.log"), fault, point, drill_id)
    injected = "kill" if point == "corrupt_after_commit" else point
    faults_seen = [d for d in first.lines if d.get("kind") == "fault"
                   and d.get("point") == injected]
    res["crash"] = _crash_of(first, faults_seen)
    if point == "corrupt_after_commit":
        res["corrupted"] = corrupt_newest(location)
    chosen = expected_generation(manifests(location),
                                 (res.get("corrupted") or {}).get("generation_id"))
    res["expected"] = chosen["generation_id"] if chosen else None
    res["expected_update"] = chosen.get("update") if chosen else 0

    second = _launch(opts, run_id, location, os.path.join(workdir, run_id, "launch2"),
                     os.path.join(workdir, run_id, "launch2.log"), None, point, drill_id)
    res["resume"] = {"returncode": second.returncode, "seconds": second.seconds,
                     "log": second.log}
    restores = [d for d in second.lines if d.get("kind") == "restore"]
    res["restored"] = restores[0]["generation_id"] if restores else None
    plans = [d for d in second.lines if d.get("kind") == "plan"]
    res["plan"] = ({k: plans[0].get(k) for k in ("source", "generation_id", "rejected",
                                                 "warnings", "newer_undecided",
                                                 "wait_undecided_s")} if plans else None)
    res["expected_at_restore"], warning = expected_at_restore(res["expected"], res["plan"])
    res["warnings"] = [warning] if warning else []
    resumed = updates_of(second.lines)
    restored_update = (min(u for u, _ in resumed) - 1) if resumed else None
    res["restored_update"] = restored_update
    seq = lineage(first.lines, second.lines)
    res["first_divergence"] = first_divergence(control, seq)
    res["ids_recorded"] = ids_recorded(control, seq)
    res["data_divergence"] = data_divergence(control, seq) if res["ids_recorded"] else None
    moved = reordered(control, seq)
    if moved and res["data_divergence"] is None:
        res["warnings"].append(
            f"the positions differ from the control's at {len(moved)} update(s) and rank(s) "
            f"(first u{moved[0][0]} r{moved[0][1]}) but every rank received the same samples "
            "per update: the order's positions were renumbered, not a divergence of the data")
    res["state"] = _state_of(opts, control, resumed, restored_update)
    res["cost"] = _cost_of(first, second, faults_seen, restored_update)
    res["server"] = server_verdict(opts.url, opts.token, run_id, opts.analysis_timeout)
    res["attempt"] = max((d.get("attempt") or 0 for d in second.lines
                          if d.get("kind") == "update"), default=None)
    res["failures"] = drill_failures(res)
    if res["restored"] != res["expected_at_restore"]:
        res["failures"].append(plan_text(res["plan"]))
    res["passed"] = not res["failures"]
    return res


def plan_text(plan: dict | None) -> str:
    """What the resumed launch's ``restore_plan`` answered, as said under a wrong restore:
    ``the resumed launch's restore plan (<source>) named <generation>`` and, for a refusal, the
    generations the server listed with their status; or that no plan was traced (the trainer
    chose its generation without ``restore_plan``)."""
    if plan is None:
        return "the resumed launch traced no restore plan (restore_plan was not called)"
    out = (f"the resumed launch's restore plan ({plan.get('source')}) named "
           f"{plan.get('generation_id') or 'no generation (a fresh start)'}")
    rejected = plan.get("rejected") or []
    if rejected:
        out += "; not restorable there: " + ", ".join(
            f"{r.get('generation_id')} ({r.get('status')})" for r in rejected)
    if plan.get("warnings"):
        out += "; warnings: " + ", ".join(str(w) for w in plan["warnings"])
    return out


def run_drill(opts: DrillOptions) -> dict:
    """Run the control and every crash point of ``opts``; returns the report (module doc)."""
    drill_id = opts.drill_id or new_drill_id()
    opts.location = os.path.abspath(opts.location)
    workdir = opts.workdir or os.path.join(opts.location, f".drill-{drill_id}")
    started = time.time()
    run_id = f"{drill_id}-control"
    if opts.echo:
        print(f"drill {drill_id}: control run {run_id} ({opts.updates} updates)", flush=True)
    ctl = _launch(opts, run_id, os.path.join(opts.location, run_id),
                  os.path.join(workdir, run_id, "launch1"),
                  os.path.join(workdir, run_id, "launch1.log"), None, "control", drill_id)
    control = updates_of(ctl.lines)
    report: dict[str, Any] = {
        "format": REPORT_FORMAT, "drill_id": drill_id, "config_digest": config_digest(opts.command),
        "command": opts.command, "updates": opts.updates, "at": opts.at, "kill": opts.kill,
        "wait_undecided_s": opts.wait_undecided_s,
        "state_compare": "exact: sha256 of the parameters" if opts.tolerance is None else
        f"tolerance {opts.tolerance}: sum and L2 norm of every parameter tensor",
        "loss_compared": False, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime(started)),
        "control": {"run_id": run_id, "returncode": ctl.returncode, "seconds": ctl.seconds,
                    "updates": max((u for u, _ in control), default=0), "log": ctl.log},
        "drills": [],
    }
    if ctl.returncode != 0 or not control:
        report["control"]["failure"] = (f"the control run exited {ctl.returncode}"
                                        if ctl.returncode else "the control run traced nothing "
                                        "(is the recorder an ObservedRecorder?)")
        report["passed"] = False
        return report
    for point in opts.points:
        if opts.echo:
            print(f"drill {drill_id}: {point}", flush=True)
        report["drills"].append(run_point(opts, point, drill_id, workdir, control))
    report["passed"] = all(d["passed"] for d in report["drills"])
    report["seconds"] = round(time.time() - started, 3)
    report["sent"] = send_report(opts.url, opts.token, report)
    return report


def result_event(report: dict, d: dict) -> dict:
    """The ``drill_result`` event of one crash point (docs/ingest-v1.md#drill_result)."""
    s = d.get("server") or {}
    ev = {"type": "drill_result", "drill_id": report["drill_id"],
          "config_digest": report["config_digest"], "point": d["point"],
          "passed": bool(d["passed"]), "expected_generation": d.get("expected"),
          "restored_generation": d.get("restored"), "verdict": s.get("verdict"),
          "replayed": s.get("replayed"), "omitted": s.get("omitted"),
          "recomputed": s.get("recomputed"),
          "first_divergence": _wire_divergence(d.get("first_divergence")),
          "state": {**d["state"], "compare": report["state_compare"]},
          "cost": {k: d["cost"].get(k) for k in ("lost_updates", "lost_seconds",
                                                  "restore_seconds", "fast_forward_seconds")
                   if d["cost"].get(k) is not None},
          "failures": [f[:500] for f in d.get("failures", [])][:20],
          "control_run_id": report["control"]["run_id"]}
    return {k: v for k, v in ev.items() if v is not None}


def _wire_divergence(d: dict | None) -> dict | None:
    """``first_divergence`` as docs/ingest-v1.md#drill_result has it (the data divergence is
    sent in the failures' words)."""
    if d is None:
        return None
    return {k: d.get(k) for k in ("update", "rank", "index", "control", "drill")}


def send_report(url: str | None, token: str | None, report: dict, timeout: float = 15.0) -> bool:
    """Send one ``drill_result`` per crash point on its drill run (attempt: the resumed
    launch's), so the dashboard's Drills page shows it. Returns whether every event was
    delivered within ``timeout`` seconds (False without a server)."""
    from recoverydash.sdk.client import Client

    if not url or not token:
        return False
    ok = True
    for d in report.get("drills", []):
        client = Client(url, token, d["run_id"], attempt=d.get("attempt") or 0, rank=None,
                        spool_dir=False)
        client._emit_typed(result_event(report, d), f"drill:{report['drill_id']}:{d['point']}")
        delivered = client.close(timeout)
        ok = ok and delivered and client.counters().get("quarantined", 0) == 0
    return ok


# --- the table -----------------------------------------------------------------------------------

def _pos(p) -> str:
    return "-" if p is None else (f"{p[0]}:e{p[1]}:{p[2]}" if p[1] is not None else str(p[2]))


def divergence_text(d: dict | None, data: dict | None = None,
                    ids: bool | None = None) -> str:
    """The table's divergence column. Positions only (``ids`` None, an older report; or False:
    ``(ids not recorded)`` added): ``none`` or ``u<update> r<rank> #<index>: <control position>
    vs <drill position>``. With the sample ids (``ids`` True): ``data`` (a
    ``data_divergence``) as ``u<update> r<rank> samples: <n> only in control, <m> only here``,
    ``none`` without one, ``none (positions renumbered)`` when only the positions differ."""
    if ids:
        if data is not None:
            return (f"u{data['update']} r{data['rank']} samples: {len(data['control_only'])} "
                    f"only in control, {len(data['drill_only'])} only here")
        return "none" if d is None else "none (positions renumbered)"
    if d is None:
        return "none"
    return (f"u{d['update']} r{d['rank']} #{d['index']}: {_pos(d['control'])} vs "
            f"{_pos(d['drill'])}" + (" (ids not recorded)" if ids is False else ""))


def table(report: dict) -> str:
    """The printed report: one row per crash point (crash point, restored generation (and the
    expected one when they differ), the server's verdict with replayed/omitted/recomputed,
    first divergence, state match, restore seconds, result); the header says how long the
    launches waited for undecided generations at most (``wait_undecided_s``, when the report has
    it); then each crash point's warnings and failures."""
    head = ["crash point", "restored", "verdict r/o/c", "first divergence", "state",
            "restore s", "result"]
    rows = [head]
    for d in report.get("drills", []):
        restored = str(d.get("restored"))
        if d.get("restored") != d.get("expected"):
            restored += f" (rules: {d.get('expected')}" + (
                ", undecided at restore)" if d.get("warnings") else ")")
        s = d.get("server")
        verdict = "not asked" if s is None else (
            f"{s['verdict']} {s['replayed']}/{s['omitted']}/{s['recomputed']}"
            if s.get("verdict") else f"unknown ({s.get('error', '')[:40]})")
        st = d["state"]
        state = (f"match {st['updates_compared']} updates" if st["match"] else
                 f"differs at u{st['first_mismatch']}")
        rs = d["cost"]["restore_seconds"]
        rows.append([d["point"], restored, verdict, divergence_text(
            d["first_divergence"], d.get("data_divergence"), d.get("ids_recorded")), state,
                     "-" if rs is None else f"{rs:.3f}", "pass" if d["passed"] else "FAIL"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    wait = report.get("wait_undecided_s")
    out = [(f"drill {report['drill_id']} (trainer {report['config_digest']}, "
            f"{report['updates']} updates, crash at generation >= u{report['at']}, "
            f"kill {report['kill']}"
            + (f", undecided wait up to {wait:g} s" if wait is not None else "")
            + f"; state {report['state_compare']}; loss not compared)")]
    if report["control"].get("failure"):
        out.append(f"control {report['control']['run_id']}: {report['control']['failure']} "
                   f"(log {report['control']['log']})")
    out += lines
    for d in report.get("drills", []):
        for w in d.get("warnings") or []:
            out.append(f"{d['point']}: warning: {w}")
        for f in d["failures"]:
            out.append(f"{d['point']}: {f}")
    out.append("all drills passed" if report.get("passed") else "DRILL FAILED")
    return "\n".join(out)


# --- command line --------------------------------------------------------------------------------

def add_parser(sub) -> None:
    """The ``drill`` subcommand of ``python -m recoverydash.sdk``."""
    d = sub.add_parser("drill", help="crash a disposable run at each checkpoint step, resume it "
                       "and compare with an uninterrupted control run",
                       description=__doc__.split("\n\n")[0])
    d.add_argument("--updates", type=int, required=True, help="U: updates each run reaches")
    d.add_argument("--at", type=int, required=True,
                   help="the faulted generation is the first saved at an update >= this")
    d.add_argument("--location", required=True,
                   help="base checkpoint folder; each run gets <location>/<run_id>")
    d.add_argument("--points", default=",".join(CRASH_POINTS),
                   help="comma-separated crash points (default: all five)")
    d.add_argument("--kill", default="all", help="the rank SIGKILLed, or 'all' (default)")
    d.add_argument("--kill-at", type=int, default=None,
                   help="corrupt_after_commit: kill after this update (default --at + 1)")
    d.add_argument("--compare-updates", type=int, default=None,
                   help="K: updates after the resume whose state is compared (default: to U)")
    d.add_argument("--tolerance", type=float, default=None,
                   help="compare parameters within this tolerance instead of exact sha256")
    d.add_argument("--drill-id", default=None, help="default drill-<UTC time>-<hex>")
    d.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"),
                   help="server base URL: ask its verdicts and send the report")
    d.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    d.add_argument("--json", default=None, help="write the report as JSON to this file")
    d.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    d.add_argument("--wait-undecided", type=float, default=DRILL_WAIT_UNDECIDED_S,
                   help="seconds the launches' restore_plan waits for newer generations the "
                        f"server has not decided yet (default {DRILL_WAIT_UNDECIDED_S:g}, at "
                        f"most {MAX_WAIT_UNDECIDED_S:g})")
    d.add_argument("trainer", nargs=argparse.REMAINDER,
                   help="-- the training command, with {run_id} {location} {updates}")


def main(args: argparse.Namespace) -> int:
    """Run the ``drill`` subcommand; returns the exit status (0 passed, 1 failed, 2 usage)."""
    command = list(args.trainer)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("error: give the training command after --", file=sys.stderr)
        return 2
    points = tuple(p for p in args.points.split(",") if p)
    bad = [p for p in points if p not in CRASH_POINTS]
    if bad:
        print(f"error: unknown crash point(s) {', '.join(bad)} (one of "
              f"{', '.join(CRASH_POINTS)})", file=sys.stderr)
        return 2
    if args.kill != "all" and not args.kill.isdigit():
        print("error: --kill must be 'all' or a rank", file=sys.stderr)
        return 2
    if args.updates < 1 or args.at < 1 or args.at > args.updates:
        print("error: need 1 <= --at <= --updates", file=sys.stderr)
        return 2
    if not 0 <= args.wait_undecided <= MAX_WAIT_UNDECIDED_S:
        print(f"error: --wait-undecided must be 0 to {MAX_WAIT_UNDECIDED_S:g} seconds",
              file=sys.stderr)
        return 2
    opts = DrillOptions(command=command, updates=args.updates, at=args.at,
                        location=args.location, points=points, kill=args.kill,
                        kill_at=args.kill_at, compare_updates=args.compare_updates,
                        tolerance=args.tolerance, drill_id=args.drill_id, url=args.url,
                        token=args.token, timeout=args.timeout,
                        wait_undecided_s=args.wait_undecided)
    report = run_drill(opts)
    print(table(report), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report.get("passed") else 1
