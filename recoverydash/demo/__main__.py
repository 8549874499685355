"""``make demo``: recoverydash on a real, fault-injected PyTorch training job.

Sets up a fresh demo instance (``var/demo/``, or ``RECOVERYDASH_DEMO_DIR``): its own SQLite and
filesystem broker, a superuser, a project ``demo`` with a token, and a storage location per run;
starts web + worker + beat (``python -m recoverydash.serve``); then runs one short training job per
seed fault (4 gloo ranks on the CPU, see ``trainer.py``), each as attempt 0 (the fault) and
attempt 1 (the restart): nine faults, the last a restart whose loader state was not restored. The
ranks record observed positions (``ObservedRecorder``): what the table shows is what the loaders
delivered. A tenth run is a Megatron-Core trainer (``megatron.py``: ``examples/megatron_gpt.py``,
``GPTDataset`` blended over two sources, batch-size ramp-up, the ledger in tokens) whose restart
does not restore the loader's ``consumed_samples``: a replay counted in tokens, checked against
the token values the model received. It waits until every run's analysis is current, prints each
injected fault beside what recoverydash concluded, and keeps serving until Ctrl-C.

Environment: ``PORT`` (default 8000; a free one is picked when it is busy), ``DEMO_EXIT=1`` (exit
after the table: status 0 only when every conclusion matches), ``DEMO_ONLY=a,d,f`` (a subset of the
faults), ``RECOVERYDASH_DEMO_DIR``, ``DEMO_ANALYSIS_TIMEOUT`` (seconds, default 120),
``DEMO_SCREENSHOTS`` (a folder: screenshots of the dashboard in headless Chromium).

Checkpoint storage. By default every run's generations go into the local folder
``<demo dir>/ckpt/<run_id>``. S3 mode (any S3-compatible store: AWS, MinIO, moto) is chosen by::

    RECOVERYDASH_DEMO_S3=s3://bucket/prefix          # the prefix is optional
    RECOVERYDASH_DEMO_S3_ENDPOINT=http://host:9000   # optional; unset: AWS S3
    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...  # optional; unset: boto3's default chain
    AWS_DEFAULT_REGION=...                           # optional; default us-east-1

(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` are used when ``RECOVERYDASH_DEMO_S3_ENDPOINT`` is
unset.) The bucket must exist. Every run's checkpoint location is then
``s3://bucket/prefix/<run_id>``; whatever is under those run prefixes is deleted first (the demo
starts fresh, as it does with its local folder). The ranks publish there with the SDK
(``save_generation`` uploads each file with a ChecksumSHA256, the manifest is one conditional
PUT) and restore from there (``select_restorable`` / ``load_generation``); each run's
``StorageLocation`` row carries the endpoint, region and keys, so the server verifies the objects
and discovers manifests in the bucket (fault d) with that location's credentials; only without
keys does the location allow the server's own (``use_ambient_credentials``), which the server
process then gets in its environment (``AWS_*``, ``AWS_ENDPOINT_URL_S3``). The storage in use is
printed at start.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The job: 96 samples, 4 ranks x microbatch 2 x accumulation 2 = 16 positions per update,
# 6 updates per epoch, a checkpoint every 2 updates.
N, WORLD, MICRO, ACCUM, CKPT_EVERY = 96, 4, 2, 2, 2
GB = WORLD * MICRO * ACCUM


@dataclass
class Scenario:
    key: str
    run_id: str
    title: str
    fault: str                    # trainer fault of attempt 0
    fault_update: int
    resume: str = "checkpoint"    # trainer resume mode of attempt 1
    world_after: int = WORLD
    discover: bool = False        # run manifest discovery between the attempts
    trainer: str = "ddp"          # "ddp" (trainer.py) or "megatron" (megatron.py)
    # expectations
    generations: dict = field(default_factory=dict)  # generation_id -> (status, reason code|None)
    restart: dict = field(default_factory=dict)      # key -> value (verdict, counts, resumed_from)
    findings: tuple = ()          # restart finding codes that must be present
    alerts: tuple = ()            # alert rules that must be raised
    no_alerts: tuple = ("restart_replay", "restart_omission")


def scenarios() -> list[Scenario]:
    at_ckpt = {"fault_update": 4}
    # a crash while reading update 6: 5 committed, 1 microbatch per rank read (8 positions)
    mid = {"fault": "crash_mid_update", "fault_update": 6}
    read = 5 * GB + WORLD * MICRO   # 88: the read cursor at the crash
    ckpt = 4 * GB                   # 64: the committed cursor of u000000004
    rolled = read - ckpt            # 24: read or committed after the checkpoint, rolled back
    return [
        Scenario("a", "demo-a-killed-before-shard", "rank 3 killed before any shard is written",
                 "kill_before_shard", **at_ckpt,
                 generations={"u000000004-a0": ("abandoned", "never_committed"),
                              "u000000002-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000002-a0", "verdict": "exact", "replayed": 0,
                          "omitted": 0, "recomputed": 2 * GB, "lost_updates": 2}),
        Scenario("b", "demo-b-killed-mid-shard", "rank 3 killed while writing its shard",
                 "kill_mid_shard", **at_ckpt,
                 generations={"u000000004-a0": ("abandoned", "never_committed"),
                              "u000000002-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000002-a0", "verdict": "exact", "replayed": 0,
                          "omitted": 0, "recomputed": 2 * GB, "lost_updates": 2}),
        Scenario("c", "demo-c-no-commit-marker", "all shards written, commit marker not",
                 "kill_before_commit", **at_ckpt,
                 generations={"u000000004-a0": ("abandoned", "never_committed"),
                              "u000000002-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000002-a0", "verdict": "exact", "replayed": 0,
                          "omitted": 0, "recomputed": 2 * GB, "lost_updates": 2}),
        Scenario("d", "demo-d-commit-event-lost", "manifest committed, commit event never sent",
                 "kill_after_commit", **at_ckpt, discover=True,
                 generations={"u000000004-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000004-a0", "verdict": "exact", "replayed": 0,
                          "omitted": 0, "recomputed": 0, "lost_updates": 0}),
        Scenario("e", "demo-e-fewer-ranks", "restart on 2 ranks instead of 4", **mid,
                 world_after=2,
                 generations={"u000000004-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000004-a0", "verdict": "exact", "replayed": 0,
                          "omitted": 0, "recomputed": rolled, "lost_updates": 1,
                          "world_size_before": 4, "world_size_after": 2},
                 findings=("world_size_changed",), alerts=("world_size_changed",)),
        Scenario("f", "demo-f-resume-read-cursor", "loader resumes from the read cursor", **mid,
                 resume="read_cursor",
                 generations={"u000000004-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000004-a0", "verdict": "omission", "replayed": 0,
                          "omitted": rolled, "recomputed": 0, "lost_updates": 1},
                 findings=("omission",), alerts=("restart_omission",),
                 no_alerts=("restart_replay",)),
        Scenario("g", "demo-g-resume-older-cursor", "loader resumes one global batch behind",
                 **mid, resume="older",
                 generations={"u000000004-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000004-a0", "verdict": "replay", "replayed": GB,
                          "omitted": 0, "recomputed": rolled, "lost_updates": 1},
                 findings=("replay",), alerts=("restart_replay",),
                 no_alerts=("restart_omission",)),
        Scenario("h", "demo-h-clean-restart", "clean restart at the committed cursor", **mid,
                 generations={"u000000004-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000004-a0", "verdict": "exact", "replayed": 0,
                          "omitted": 0, "recomputed": rolled, "lost_updates": 1}),
        # the model resumes at update 4, the loader iterates epoch 0 from its start: the 64
        # positions behind the checkpoint's cursor are trained again; the rest of what attempt 0
        # had read (64-87) is recomputed
        Scenario("i", "demo-i-loader-not-restored",
                 "loader state not restored (the epoch from its start)", **mid,
                 resume="not_restored",
                 generations={"u000000004-a0": ("restorable", None)},
                 restart={"resumed_from": "u000000004-a0", "verdict": "replay", "replayed": ckpt,
                          "omitted": 0, "recomputed": rolled, "lost_updates": 1},
                 findings=("replay",), alerts=("restart_replay",),
                 no_alerts=("restart_omission",)),
        megatron_scenario(),
    ]


def megatron_scenario() -> Scenario:
    """(j) Megatron-Core, in tokens: attempt 0 dies after update 6 (the generation of update 4
    is the newest), attempt 1 restores the model of update 4 but restarts ``consumed_samples``
    at 0 and trains updates 5-10. On the ramp, updates 1-4 took 4, 4, 6, 6 samples and 5-6 took
    8 + 8; attempt 1 takes 4, 4, 6, 6, 8, 8 = samples 0-35 again: the 20 samples (640 tokens) of
    the live lineage are replayed, the 16 (512 tokens) of the rolled-back updates recomputed."""
    from recoverydash.demo import megatron as mg

    took = mg.ramp_samples(mg.CRASH_AFTER)
    lineage, rolled_end = sum(took[:mg.SAVE_EVERY]), sum(took)
    again = sum(mg.ramp_samples(mg.UPDATES - mg.SAVE_EVERY))  # attempt 1: samples [0, again)
    return Scenario(
        "j", "demo-j-megatron-tokens",
        "Megatron-Core GPT (tokens, batch ramp-up): consumed_samples not restored",
        "megatron_crash_after_update", mg.CRASH_AFTER, resume="data_not_restored",
        world_after=1, trainer="megatron",
        generations={f"u{mg.SAVE_EVERY:09d}-a0": ("restorable", None)},
        restart={"resumed_from": f"u{mg.SAVE_EVERY:09d}-a0", "verdict": "replay",
                 "replayed": min(again, lineage) * mg.SEQ, "omitted": 0,
                 "recomputed": max(0, min(again, rolled_end) - lineage) * mg.SEQ,
                 "lost_updates": mg.CRASH_AFTER - mg.SAVE_EVERY, "units": "tokens"},
        findings=("replay",), alerts=("restart_replay",), no_alerts=("restart_omission",))


@dataclass
class S3Mode:
    """The demo's S3 storage, from the environment (module doc)."""

    url: str                  # s3://bucket/prefix (no trailing slash)
    bucket: str
    prefix: str
    endpoint: str = ""
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""

    @classmethod
    def from_env(cls, env=os.environ) -> S3Mode | None:
        """None when ``RECOVERYDASH_DEMO_S3`` is unset; ValueError when it is malformed."""
        raw = (env.get("RECOVERYDASH_DEMO_S3") or "").strip()
        if not raw:
            return None
        if not raw.startswith("s3://"):
            raise ValueError(f"RECOVERYDASH_DEMO_S3 must be s3://bucket[/prefix], got {raw!r}")
        bucket, _, prefix = raw[len("s3://"):].partition("/")
        prefix = prefix.strip("/")
        if not bucket:
            raise ValueError(f"RECOVERYDASH_DEMO_S3 names no bucket: {raw!r}")
        endpoint = (env.get("RECOVERYDASH_DEMO_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL_S3")
                    or env.get("AWS_ENDPOINT_URL") or "").strip()
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"RECOVERYDASH_DEMO_S3_ENDPOINT must be an http(s) URL, got "
                             f"{endpoint!r}")
        return cls(url=f"s3://{bucket}" + (f"/{prefix}" if prefix else ""), bucket=bucket,
                   prefix=prefix, endpoint=endpoint,
                   region=(env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION")
                           or "us-east-1").strip(),
                   access_key_id=(env.get("AWS_ACCESS_KEY_ID") or "").strip(),
                   secret_access_key=(env.get("AWS_SECRET_ACCESS_KEY") or "").strip())

    def location(self, run_id: str) -> str:
        return f"{self.url}/{run_id}"

    def client_args(self) -> dict:
        """Arguments of ``recoverydash.checkpoints.objects.make_s3_client``."""
        return {"endpoint_url": self.endpoint or None, "region": self.region,
                "access_key_id": self.access_key_id or None,
                "secret_access_key": self.secret_access_key or None}

    def client(self):
        from recoverydash.checkpoints.objects import make_s3_client

        return make_s3_client(**self.client_args())

    def server_env(self) -> dict:
        """What the server process (web, worker, beat) needs to reach the store."""
        env = {"AWS_DEFAULT_REGION": self.region}
        if self.access_key_id:
            env["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self.secret_access_key:
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.endpoint:
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint
        return env

    def describe(self) -> str:
        key = (f"key {self.access_key_id[:4]}..., secret set" if self.access_key_id
               else "credentials from boto3's default chain")
        return (f"S3: {self.url}/<run_id> (endpoint {self.endpoint or 'AWS'}, region "
                f"{self.region}, {key})")

    def run_prefix(self, run_id: str) -> str:
        return "/".join(p for p in (self.prefix, run_id) if p) + "/"

    def clear_runs(self, client, runs: list[Scenario]) -> int:
        """Delete every object under the runs' prefixes (a fresh start); returns how many."""
        n = 0
        for s in runs:
            for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self.run_prefix(s.run_id)):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
                if keys:
                    client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})
                    n += len(keys)
        return n

    def generations(self, client, run_id: str) -> dict:
        """generation folder -> whether its manifest is in the bucket."""
        from recoverydash.checkpoints.objects import MANIFEST_NAME

        prefix = self.run_prefix(run_id)
        out: dict = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                     Prefix=prefix):
            for o in page.get("Contents", ()):
                gen, _, rest = o["Key"][len(prefix):].partition("/")
                out[gen] = out.get(gen, False) or rest == MANIFEST_NAME
        return dict(sorted(out.items()))


def say(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the demo instance ----------------------------------------------------------------------------

def setup_instance(base: Path, runs: list[Scenario], s3: S3Mode | None = None) -> dict:
    """Fresh var dir, migrate, user, project, membership, token, storage locations (a folder per
    run, or with ``s3`` an S3 prefix per run carrying the endpoint, region and keys)."""
    var = base / "var"
    if base.exists():
        shutil.rmtree(base)
    (base / "ckpt").mkdir(parents=True)
    os.environ["RECOVERYDASH_VAR_DIR"] = str(var)
    # the collected static files outlive the demo's fresh instance: compressed once per change
    os.environ.setdefault("STATIC_ROOT", str(REPO / "var" / "staticfiles"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from recoverydash.runs.models import ApiToken, Membership, Project
    from recoverydash.storage.models import StorageLocation

    call_command("migrate", interactive=False, verbosity=0)
    from recoverydash.dashboard.staticfiles import collect_if_changed

    if collect_if_changed():
        say(f"static files collected (hashed names, gzip and brotli copies) into "
            f"{os.environ['STATIC_ROOT']}")
    password = "demo-" + secrets.token_urlsafe(6)
    user = get_user_model().objects.create_superuser("demo", "demo@example.invalid", password)
    project = Project.objects.create(name="demo")
    Membership.objects.create(project=project, user=user)
    _, token = ApiToken.issue(project, ["ingest", "read"], name="demo")
    for s in runs:
        if s3 is not None:
            # the location's own keys; boto3's chain (the server's own) only when none given
            StorageLocation.objects.create(
                project=project, url=s3.location(s.run_id), run_id=s.run_id, origin="demo",
                endpoint_url=s3.endpoint, region=s3.region, access_key_id=s3.access_key_id,
                secret_access_key=s3.secret_access_key,
                use_ambient_credentials=not s3.access_key_id)
            continue
        folder = base / "ckpt" / s.run_id
        folder.mkdir()
        StorageLocation.objects.create(project=project, url=folder.resolve().as_uri(),
                                       run_id=s.run_id, origin="demo")
    from django.db import connections

    connections.close_all()
    return {"user": "demo", "password": password, "token": token, "var": var}


def start_server(var: Path, port: int, log_path: Path,
                 extra_env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PORT": str(port), "RECOVERYDASH_VAR_DIR": str(var),
           "WEB_CONCURRENCY": "1", "CELERY_CONCURRENCY": "1",
           "SITE_URL": f"http://localhost:{port}", **(extra_env or {})}
    log = open(log_path, "ab")  # noqa: SIM115 (the server process keeps writing to it)
    return subprocess.Popen([sys.executable, "-m", "recoverydash.serve"], env=env, cwd=str(REPO),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(proc: subprocess.Popen):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> bool:
    from recoverydash.demo.util import get_json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        status, _ = get_json(url + "/healthz", timeout=2)
        if status == 200:
            return True
        time.sleep(0.5)
    return False


# --- the jobs -------------------------------------------------------------------------------------

def run_scenario(s: Scenario, base: Path, url: str, token: str,
                 s3: S3Mode | None = None) -> dict:
    from recoverydash.demo.trainer import launch

    loc = s3.location(s.run_id) if s3 is not None else str(base / "ckpt" / s.run_id)
    if s.trainer == "megatron":
        from recoverydash.demo import megatron

        return megatron.run(s.run_id, base, url, token, loc, say)
    common = {"url": url, "token": token, "run_id": s.run_id, "location": loc,
              "spool": str(base / "spool"), "n": N, "micro": MICRO, "epochs": 1,
              "ckpt_every": CKPT_EVERY, "loader_state": str(base / f"loader-{s.key}.json"),
              "quiet_crash": True, "world_before": WORLD}
    if s3 is not None:  # each rank makes its own client (after the fork) from these
        common.update(s3=s3.client_args(), staging=str(base / "staging"))
    t0 = time.monotonic()
    codes0 = launch({**common, "attempt": 0, "accum": ACCUM, "fault": s.fault,
                     "fault_update": s.fault_update}, WORLD)
    if s3 is not None:
        on_disk = s3.generations(s3.client(), s.run_id)
    else:
        on_disk = {g: os.path.exists(os.path.join(loc, g, "recoverydash-manifest.json"))
                   for g in sorted(os.listdir(loc))}
    say(f"  {s.key}: attempt 0 ({WORLD} ranks) exit codes {codes0}; in storage: "
        + ", ".join(f"{g}{'' if m else ' (no manifest)'}" for g, m in on_disk.items()))
    discovered = None
    if s.discover:
        from recoverydash.ingest.discovery import discover_all

        discovered = discover_all()
        say(f"  {s.key}: manifest discovery ingested {discovered} manifest(s) found in storage")
    accum = ACCUM * WORLD // s.world_after  # keep the global batch when the world shrinks
    codes1 = launch({**common, "attempt": 1, "accum": accum, "resume": s.resume,
                     "world_before": WORLD}, s.world_after)
    say(f"  {s.key}: attempt 1 ({s.world_after} ranks, resume: {s.resume}) exit codes {codes1} "
        f"({time.monotonic() - t0:.1f} s)")
    return {"codes0": codes0, "codes1": codes1, "discovered": discovered, "on_disk": on_disk,
            "location": loc}


def wait_analysis(url: str, token: str, runs: list[Scenario], jobs: dict,
                  timeout: float) -> dict:
    """The /recovery answer of every run once it is current (or the last one at the timeout)."""
    from recoverydash.demo.util import get_json

    deadline = time.monotonic() + timeout
    answers: dict = {}
    while True:
        waiting = []
        for s in runs:
            status, body = get_json(f"{url}/api/v1/runs/{s.run_id}/recovery", token)
            answers[s.run_id] = body if status == 200 else {"error": status, "body": body}
            restarted = jobs[s.run_id]["codes1"] == [0] * s.world_after
            if not _settled(body if status == 200 else None, restarted):
                waiting.append(s.key)
        if not waiting:
            return answers
        if time.monotonic() > deadline:
            say(f"analysis not current after {timeout:.0f} s for: {', '.join(waiting)}")
            return answers
        time.sleep(2)


def _settled(body, restarted: bool = True) -> bool:
    if not body or body.get("pending_analysis"):
        return False
    if any(g["status"] in ("pending", "committed") for g in body.get("generations", [])):
        return False
    rs = body.get("restarts") or []
    return (bool(rs) or not restarted) and all(r.get("verdict") != "unverified" for r in rs)


# --- the table ------------------------------------------------------------------------------------

# the rank each fault kills and its exit code (trainer.py: os._exit(17); the Megatron example:
# os._exit(3))
KILLED_RANK = {"kill_before_shard": (3, 17), "kill_mid_shard": (3, 17),
               "kill_before_commit": (0, 17), "kill_after_commit": (0, 17),
               "crash_mid_update": (1, 17), "megatron_crash_after_update": (0, 3)}


def judge(s: Scenario, body: dict, job: dict) -> tuple[list[str], list[str]]:
    """(lines of what recoverydash concluded, mismatches): the generations, the restart of
    attempt 1, the alerts, and the job itself (the fault really happened, the restart ran, the
    truth of the sample log where there is one)."""
    if not body or "generations" not in body:
        return [f"no analysis: {body}"], [f"no analysis answer: {body}"]
    lines: list[str] = []
    bad: list[str] = []
    for part in (_judge_generations, _judge_restart, _judge_alerts, _judge_job):
        more_lines, more_bad = part(s, body, job)
        lines += more_lines
        bad += more_bad
    return lines, bad


def _judge_generations(s: Scenario, body: dict, job: dict) -> tuple[list[str], list[str]]:
    lines, bad = [], []
    gens = {g["generation_id"]: g for g in body["generations"]}
    for gid, (status, reason) in s.generations.items():
        g = gens.get(gid)
        got = "absent" if g is None else g["status"]
        codes = [] if g is None else [r["code"] for r in g.get("reasons", [])]
        lines.append(f"gen {gid}: {got}" + (f" ({', '.join(codes)})" if codes else ""))
        if got != status or (reason and reason not in codes):
            bad.append(f"generation {gid}: expected {status}"
                       + (f" ({reason})" if reason else "") + f", got {got} {codes}")
    others = [g for gid, g in gens.items() if gid not in s.generations]
    if others:
        lines.append("other gens: " + ", ".join(f"{g['generation_id']} {g['status']}"
                                                for g in others))
    return lines, bad


def _judge_restart(s: Scenario, body: dict, job: dict) -> tuple[list[str], list[str]]:
    restarts = [r for r in body.get("restarts") or [] if r.get("attempt") == 1]
    if not restarts:
        return [], ["no restart of attempt 1 in the analysis"]
    r = restarts[0]
    findings = [f["code"] for f in r.get("findings") or []]
    lines = [f"restart from {r.get('resumed_from')} @ {r.get('resumed_update')}: "
             f"{r.get('verdict')}, replayed {r.get('replayed')}, omitted {r.get('omitted')}, "
             f"recomputed {r.get('recomputed')}" + (f" {r['units']}" if r.get("units") else "")
             + f", lost updates {r.get('lost_updates')}",
             f"  cursor expected {_cur(r.get('expected_cursor'))}, resumed "
             f"{_cur(r.get('resume_cursor'))}; world {r.get('world_size_before')}->"
             f"{r.get('world_size_after')}" + (f"; findings {', '.join(findings)}"
                                              if findings else "")]
    bad = [f"restart {k}: expected {v}, got {r.get(k)}" for k, v in s.restart.items()
           if r.get(k) != v]
    bad += [f"restart finding {code} expected, got {findings}" for code in s.findings
            if code not in findings]
    return lines, bad


def _judge_alerts(s: Scenario, body: dict, job: dict) -> tuple[list[str], list[str]]:
    rules = sorted({a["rule"] for a in body.get("alerts") or []})
    lines = ["alerts: " + (", ".join(f"{a['rule']} ({a['state']})"
                                     for a in body.get("alerts") or []) or "none")]
    bad = [f"alert {rule} expected, got {rules}" for rule in s.alerts if rule not in rules]
    bad += [f"alert {rule} not expected, got {rules}" for rule in s.no_alerts if rule in rules]
    return lines, bad


def _judge_job(s: Scenario, body: dict, job: dict) -> tuple[list[str], list[str]]:
    lines, bad = [], []
    if s.discover and not job.get("discovered"):
        bad.append(f"discovery ingested {job.get('discovered')} manifests, expected >= 1")
    killer, code = KILLED_RANK[s.fault]
    if job["codes0"][killer] != code:  # the fault hook's os._exit: the fault really happened
        bad.append(f"fault not injected as designed: rank {killer} of attempt 0 exited with "
                   f"{job['codes0'][killer]}, not {code}")
    truth = job.get("truth")
    if truth is not None:
        lines.append(f"truth (what the model received): replayed {truth['replayed']}, "
                     f"recomputed {truth['recomputed']} tokens")
    bad += _against_truth(s, body, truth)
    if job["codes1"] != [0] * s.world_after:
        bad.append(f"attempt 1 exit codes {job['codes1']}")
    return lines, bad


def _against_truth(s: Scenario, body: dict, truth: dict | None) -> list[str]:
    """Mismatches between the restart of attempt 1 and the truth logged from what the model
    received (the Megatron run's sample log: replayed and recomputed tokens)."""
    if truth is None:
        return ["no sample log: the truth is unknown"] if s.trainer == "megatron" else []
    r = next((r for r in body.get("restarts") or [] if r.get("attempt") == 1), {})
    return [f"restart {k}: the model received {truth[k]}, recoverydash says {r.get(k)}"
            for k in ("replayed", "recomputed") if r.get(k) != truth[k]]


def _cur(cursor) -> str:
    return ",".join(f"e{c.get('epoch')}:{c.get('position')}" for c in cursor or []) or "-"


def expectation(s: Scenario) -> list[str]:
    out = [f"{gid} {st}" + (f" ({rs})" if rs else "") for gid, (st, rs) in s.generations.items()]
    r = s.restart
    out.append(f"restart from {r['resumed_from']}: {r['verdict']}, replayed {r['replayed']}, "
               f"omitted {r['omitted']}, recomputed {r['recomputed']}"
               + (f" {r['units']}" if r.get("units") else "") + f", lost {r['lost_updates']}")
    if s.findings:
        out.append("findings " + ", ".join(s.findings))
    if s.alerts:
        out.append("alerts " + ", ".join(s.alerts))
    return out


def manage_prefix(var: Path) -> str:
    """The command prefix that runs ``manage.py`` against this demo's database (its settings
    read ``RECOVERYDASH_VAR_DIR``; without it ``manage.py`` opens another, empty database): the
    var dir and the interpreter relative to the repository when they are inside it."""
    def short(path: Path) -> str:
        path = Path(path).absolute()
        try:
            return str(path.relative_to(REPO))
        except ValueError:
            return str(path)

    return f"RECOVERYDASH_VAR_DIR={short(var)} {short(Path(sys.executable))} manage.py"


def run_pages(url: str, runs: list[Scenario]) -> dict:
    """run_id -> the dashboard page of the run."""
    try:
        from django.urls import reverse

        from recoverydash.runs.models import Run

        ids = (Run.objects.filter(project__name="demo", run_id__in=[s.run_id for s in runs])
               .values_list("run_id", flat=True))
        return {rid: url + reverse("run", args=["demo", rid]) for rid in ids}
    except Exception:  # noqa: BLE001 (the page links are a convenience)
        return {}


def print_table(runs, answers, jobs, pages=None) -> tuple[bool, list]:
    pages = pages or {}
    ok_all = True
    report = []
    width = 100
    print("\n" + "=" * width)
    print("injected fault  ->  what recoverydash concluded")
    print("=" * width)
    for s in runs:
        lines, bad = judge(s, answers.get(s.run_id), jobs[s.run_id])
        ok_all &= not bad
        report.append({"key": s.key, "run_id": s.run_id, "fault": s.title, "ok": not bad,
                       "mismatches": bad, "concluded": lines})
        print(f"({s.key}) {s.title}   [run {s.run_id}]   {'MATCH' if not bad else 'MISMATCH'}")
        for e in expectation(s):
            print(f"      expected: {e}")
        for line in lines:
            print(f"      got:      {line}")
        for b in bad:
            print(f"      !! {b}")
        if s.run_id in pages:
            print(f"      dashboard: {pages[s.run_id]}")
        print("-" * width)
    return ok_all, report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: no arguments (everything is in the environment, module docstring);
    ``--help`` prints the docstring and exits without starting anything."""
    parser = argparse.ArgumentParser(prog="python -m recoverydash.demo",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser.parse_args(argv)


def own_folder(base: Path):
    """Hold the demo folder ``base`` for this process: an exclusive lock on ``.<name>.lock``
    beside it (the folder itself is wiped at start), given back by the kernel when the process
    ends. Returns the open lock file, or None when another demo holds it."""
    import fcntl

    base.parent.mkdir(parents=True, exist_ok=True)
    lock = open(base.parent / f".{base.name}.lock", "a+")  # noqa: SIM115 - held while running
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        say(f"the demo folder {base} is in use by {holder}: stop that demo first, or set "
            "RECOVERYDASH_DEMO_DIR to another folder")
        return None
    lock.truncate(0)
    lock.write(f"demo pid {os.getpid()}\n")
    lock.flush()
    return lock


def _terminate(signum, frame):
    """SIGTERM: unwind like Ctrl-C, so the ``finally`` blocks stop the server and the ranks."""
    raise KeyboardInterrupt


def stop_ranks() -> None:
    """Kill the training ranks this process forked and still runs (``trainer.launch``)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)


def without_unrunnable(runs: list[Scenario], s3: S3Mode | None) -> list[Scenario]:
    """``runs`` without the Megatron run where it cannot run, saying why: without megatron-core
    (the ``frameworks`` extra), or in S3 mode (its checkpoints go to a local folder only: the
    example's client would reach the store through boto3's environment, untested here)."""
    from recoverydash.demo import megatron

    why = ("S3 mode (the Megatron run saves to local folders only)" if s3 is not None else
           None if megatron.available() else "megatron-core is not installed (make install)")
    if why is None:
        return runs
    skipped = [s.key for s in runs if s.trainer == "megatron"]
    if skipped:
        say(f"run ({', '.join(skipped)}) left out: {why}")
    return [s for s in runs if s.trainer != "megatron"]


def main() -> int:
    parse_args()
    t_start = time.monotonic()
    base = Path(os.environ.get("RECOVERYDASH_DEMO_DIR", REPO / "var" / "demo")).resolve()
    folder_lock = own_folder(base)
    if folder_lock is None:
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    only = [k.strip() for k in os.environ.get("DEMO_ONLY", "").split(",") if k.strip()]
    runs = [s for s in scenarios() if not only or s.key in only]
    try:
        s3 = S3Mode.from_env()
    except ValueError as e:
        say(f"{e} (format: the docstring of recoverydash/demo/__main__.py)")
        return 2
    runs = without_unrunnable(runs, s3)
    if s3 is None:
        say(f"checkpoints: local folder {base / 'ckpt'}/<run_id> (RECOVERYDASH_DEMO_S3="
            "s3://bucket/prefix [+ RECOVERYDASH_DEMO_S3_ENDPOINT, AWS_*] for S3)")
    else:
        say(f"checkpoints: {s3.describe()}")
        try:
            client = s3.client()
            client.head_bucket(Bucket=s3.bucket)
            cleared = s3.clear_runs(client, runs)
        except Exception as e:  # noqa: BLE001 (any storage problem: say it and stop)
            say(f"cannot use bucket {s3.bucket!r}: {type(e).__name__}: {e}")
            return 2
        if cleared:
            say(f"deleted {cleared} object(s) of earlier demo runs under {s3.url}/<run_id>")
    from recoverydash.demo.util import free_port, port_is_free

    port = int(os.environ.get("PORT", "8000"))
    if not port_is_free(port):
        new = free_port()
        say(f"port {port} is busy: using {new}")
        port = new
    say(f"setting up a fresh demo instance in {base}")
    inst = setup_instance(base, runs, s3)
    url = f"http://localhost:{port}"
    say(f"starting web + worker + beat on {url} (log: {base / 'serve.log'})")
    server = start_server(inst["var"], port, base / "serve.log",
                          s3.server_env() if s3 is not None else None)
    try:
        if not wait_http(url, server):
            say(f"the server did not come up; see {base / 'serve.log'}")
            return 2
        say(f"server up; demo user {inst['user']} / {inst['password']}, token {inst['token']}")
        # Everything the ranks use is imported once here: they are forked from this process, so
        # a rank starts in milliseconds and never re-imports (a file edited meanwhile included).
        import torch._dynamo
        import torch.distributed.checkpoint
        import torch.distributed.checkpoint.state_dict  # noqa: F401

        import recoverydash.demo.trainer
        import recoverydash.recovery.generations
        import recoverydash.recovery.inputs
        import recoverydash.sdk  # noqa: F401

        jobs = {}
        for i, s in enumerate(runs, 1):
            say(f"[{i}/{len(runs)}] fault ({s.key}): {s.title}")
            jobs[s.run_id] = run_scenario(s, base, url, inst["token"], s3)
        say("waiting for the analysis of every run to be current ...")
        answers = wait_analysis(url, inst["token"], runs, jobs,
                                float(os.environ.get("DEMO_ANALYSIS_TIMEOUT", "120")))
        pages = run_pages(url, runs)
        ok, report = print_table(runs, answers, jobs, pages)
        screens = None
        if os.environ.get("DEMO_SCREENSHOTS"):
            from recoverydash.demo.screens import capture

            folder = Path(os.environ["DEMO_SCREENSHOTS"]).resolve()
            say(f"screenshots of the dashboard into {folder}")
            try:
                screens = capture(url, inst["user"], inst["password"], runs, pages, folder,
                                  answers)
            except Exception as exc:  # noqa: BLE001 (a browser problem must not hide the table)
                screens = [{"key": "*", "missing": [f"no screenshots: {exc}"], "shots": []}]
            for rec in screens:
                if rec["missing"]:
                    ok = False
                    print(f"  !! dashboard of ({rec['key']}) does not show: "
                          f"{', '.join(rec['missing'])}")
        storage = {"mode": "s3" if s3 is not None else "local",
                   **({"url": s3.url, "endpoint": s3.endpoint, "region": s3.region}
                      if s3 is not None else {}),
                   "locations": {rid: j["location"] for rid, j in jobs.items()}}
        (base / "results.json").write_text(json.dumps({"ok": ok, "storage": storage,
                                                       "runs": report,
                                                       "answers": answers, "screens": screens},
                                                      indent=1))
        elapsed = time.monotonic() - t_start
        print(f"{sum(r['ok'] for r in report)}/{len(report)} conclusions match "
              f"({elapsed:.0f} s)")
        print(f"dashboard: {url}/   login: {inst['user']} / {inst['password']}")
        print(f"API token (ingest, read): {inst['token']}")
        prefix = manage_prefix(inst["var"])
        print(f"manage.py on this demo's database (run from {REPO}): {prefix} <command>, e.g.\n"
              f"  {prefix} add_location --project demo --uri file:///path/to/ckpt")
        if os.environ.get("DEMO_EXIT") == "1":
            return 0 if ok else 1
        print("serving until Ctrl-C", flush=True)
        try:
            while server.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        return 0 if ok else 1
    finally:
        stop_ranks()
        stop_server(server)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\nstopped (the server and the ranks were stopped too)", file=sys.stderr)
        sys.exit(130)
