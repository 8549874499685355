"""Which attempt a launch is: a new number for every launch of a run, the same on every rank.

The rule (``resolve_attempt``), used by ``Client`` / ``init`` when no ``attempt`` is passed:

1. ``attempt=`` given to ``Client`` / ``init``: that number, as is.
2. else ``$RECOVERYDASH_ATTEMPT``: that number, as is (your launcher knows best).
3. else the *next free number*: one more than the highest attempt any of these has seen, and at
   least ``$TORCHELASTIC_RESTART_COUNT`` / ``$SLURM_RESTART_COUNT`` (0 when none has seen any):

   a. the restored generation's manifest (``restored=``: a manifest, a ``restore_plan`` answer
      or a ``Selection``; manifests carry ``attempt``);
   b. every manifest of the run's checkpoint location (``location=``; a generation id made by
      ``make_generation_id`` (``u<update>-a<attempt>``) is read from its name, other manifests
      are opened);
   c. the per-run state file ``<spool_dir>/<run_id>/attempts.json`` on this host, where every
      launch records the number it took;
   d. the server, when it answers within the timeout: ``GET /api/v1/runs`` lists the run's
      ``latest_attempt`` (needs a token with the ``read`` scope; without it, or unreachable,
      this source is skipped).

   Restart counts of torchrun / Slurm are only a floor: a second ``torchrun`` of the same run
   starts again at ``TORCHELASTIC_RESTART_COUNT=0``, and taking it as the attempt made the
   relaunch reuse attempt 0 (the server then refuses its ``attempt_started`` with 409).

All ranks of one launch agree without racing each other: when ``torch.distributed`` is
initialised, rank 0 alone looks at a-d, records the number in the state file and broadcasts it
(a collective: every rank must create its client at the same point, after
``init_process_group``, as ``init`` in every rank does). Without ``torch.distributed``, processes
of one launch on one host (same parent process, ``MASTER_ADDR``/``MASTER_PORT`` and restart count)
share the number through the state file, under a file lock. Ranks on other hosts without
``torch.distributed`` cannot be coordinated: initialise it first, or pass ``attempt``.

What the rule cannot see: a launch that died before writing any of a-d on another host (no
shared location, server down). Pass ``attempt`` or ``$RECOVERYDASH_ATTEMPT`` when you need the
number to be something in particular.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from typing import Any

from recoverydash.sdk import fetch
from recoverydash.sdk.spool import run_folder
from recoverydash.sdk.transport import api_url

log = logging.getLogger("recoverydash.sdk")

STATE_NAME = "attempts.json"
"""The per-run state file inside ``<spool_dir>/<run_id>/``."""

_GEN_ID_RE = re.compile(r"^u\d{9}-a(\d+)$")
_RESTART_VARS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
_MAX_KEYS = 64  # launch keys kept in the state file


def env_attempt() -> int | None:
    """``$RECOVERYDASH_ATTEMPT`` as an int, else None."""
    v = os.environ.get("RECOVERYDASH_ATTEMPT", "").strip()
    return int(v) if v.isdigit() else None


def restart_floor() -> int:
    """The largest of ``$TORCHELASTIC_RESTART_COUNT`` and ``$SLURM_RESTART_COUNT`` (0 if unset)."""
    out = 0
    for var in _RESTART_VARS:
        v = os.environ.get(var, "").strip()
        if v.isdigit():
            out = max(out, int(v))
    return out


def state_path(run_id: str, spool_dir: str | None = None) -> str:
    """``<spool_dir>/<run_id>/attempts.json`` (run id sanitised as the spool folder is)."""
    return os.path.join(run_folder(spool_dir, run_id), STATE_NAME)


# --- the four sources -----------------------------------------------------------------------------

def attempt_of_restored(restored: Any) -> int | None:
    """(a) The attempt recorded with a restored generation: ``restored`` is a manifest dict, a
    ``restore_plan`` answer (its ``attempt``), a ``Selection`` / ``GenerationCheck`` (its
    manifest), or None. Falls back to the ``-a<k>`` of a ``make_generation_id`` name."""
    if restored is None:
        return None
    get = restored.get if isinstance(restored, dict) else \
        (lambda k, d=None: getattr(restored, k, d))
    a = get("attempt")
    if isinstance(a, int) and not isinstance(a, bool):
        return a
    manifest = get("manifest")
    if isinstance(manifest, dict) and isinstance(manifest.get("attempt"), int):
        return manifest["attempt"]
    m = _GEN_ID_RE.match(str(get("generation_id") or ""))
    return int(m.group(1)) if m else None


def highest_in_location(location: str | None, *, s3_client=None) -> int | None:
    """(b) The highest ``attempt`` among the manifests of ``location`` (None: none, or the
    location cannot be listed)."""
    if not location:
        return None
    from recoverydash.checkpoints import objects as storage

    try:
        uris = storage.list_manifests(storage.resolve_location(location), s3_client=s3_client)
    except Exception as e:
        log.info("recoverydash: attempt: cannot list %s (%r); skipped", location, e)
        return None
    best: int | None = None
    for uri in uris:
        name = uri.rstrip("/").split("/")[-2]
        m = _GEN_ID_RE.match(name)
        a: Any
        if m:
            a = int(m.group(1))
        else:
            try:
                a = storage.read_manifest(uri, s3_client=s3_client).get("attempt")
            except Exception:
                continue
            if not isinstance(a, int) or isinstance(a, bool):
                continue
        best = a if best is None else max(best, a)
    return best


def _read_state(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def highest_in_state(run_id: str, spool_dir: str | None = None) -> int | None:
    """(c) The highest attempt recorded in this host's state file of the run."""
    h = _read_state(state_path(run_id, spool_dir)).get("highest")
    return h if isinstance(h, int) else None


def latest_on_server(url: str | None, token: str | None, run_id: str, *,
                     timeout: float = 2.0) -> int | None:
    """(d) ``latest_attempt`` of the run in ``GET {url}/api/v1/runs`` (None: the server does not
    know the run, does not answer, or the token lacks the ``read`` scope)."""
    if not url:
        return None
    req = urllib.request.Request(api_url(url, "runs?limit=5000"),
                                 headers={"Authorization": f"Bearer {token or ''}",
                                          "Accept": "application/json"})
    try:
        status, runs = fetch.get_json(req, timeout)  # the whole answer within timeout
    except Exception as e:
        log.info("recoverydash: attempt: server not consulted (%r)", e)
        return None
    if status == 403:
        log.info("recoverydash: attempt: the token has no read scope; the server's "
                 "latest_attempt is not consulted")
        return None
    if not 200 <= status < 300:
        log.info("recoverydash: attempt: GET /api/v1/runs answered %s; skipped", status)
        return None
    for r in runs if isinstance(runs, list) else []:
        if isinstance(r, dict) and r.get("run_id") == run_id:
            a = r.get("latest_attempt")
            return a if isinstance(a, int) else None
    return None


# --- the decision ---------------------------------------------------------------------------------

def _launch_key() -> str:
    """What the processes of one launch on one host share: parent process (the torchrun agent,
    the Slurm step, the mp.spawn parent), rendezvous address and restart count."""
    parts = [str(os.getppid()), os.environ.get("MASTER_ADDR", ""),
             os.environ.get("MASTER_PORT", ""), os.environ.get("TORCHELASTIC_RUN_ID", "")]
    parts += [os.environ.get(v, "") for v in _RESTART_VARS]
    return ":".join(parts)


class _Locked:
    """An exclusive ``fcntl`` lock on ``path + '.lock'`` (no-op where fcntl is missing)."""

    def __init__(self, path: str):
        self.path = path + ".lock"
        self.f = None

    def __enter__(self):
        try:
            import fcntl

            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.f = open(self.path, "a")
            fcntl.flock(self.f.fileno(), fcntl.LOCK_EX)
        except Exception:
            self.f = None
        return self

    def __exit__(self, *exc):
        if self.f is not None:
            try:
                import fcntl

                fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
            finally:
                self.f.close()


def _record(path: str, attempt: int, key: str | None) -> None:
    """Write ``attempt`` (and the launch key's number) into the state file, atomically."""
    doc = _read_state(path)
    recorded = doc.get("highest")
    highest = recorded if isinstance(recorded, int) else -1
    doc["highest"] = max(highest, attempt)
    known = doc.get("launches")
    launches: dict[str, Any] = known if isinstance(known, dict) else {}
    if key is not None:
        launches[key] = {"attempt": attempt, "time": time.time()}
        if len(launches) > _MAX_KEYS:
            keep = sorted(launches.items(), key=lambda kv: kv[1].get("time", 0))[-_MAX_KEYS:]
            launches = dict(keep)
    doc["launches"] = launches
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def next_attempt(run_id: str, *, url: str | None = None, token: str | None = None,
                 location: str | None = None, restored: Any = None,
                 spool_dir: str | None | bool = None, s3_client=None,
                 timeout: float = 2.0) -> tuple[int, dict[str, int | None]]:
    """This process's view of the next free attempt number (rule 3 of the module doc), without
    coordination. Returns ``(attempt, seen)`` where ``seen`` maps each source (``restored``,
    ``location``, ``state``, ``server``, ``restart_count``) to what it said."""
    folder = spool_dir if isinstance(spool_dir, str) and spool_dir else None
    floor = restart_floor()
    seen: dict[str, int | None] = {
        "restored": attempt_of_restored(restored),
        "location": highest_in_location(location, s3_client=s3_client),
        "state": None if spool_dir is False else highest_in_state(run_id, folder),
        "server": latest_on_server(url, token, run_id, timeout=timeout),
        "restart_count": floor}
    nxt = floor
    for k in ("restored", "location", "state", "server"):
        value = seen[k]
        if isinstance(value, int):
            nxt = max(nxt, value + 1)
    return nxt, seen


def _dist():
    try:
        import torch.distributed as dist
    except Exception:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


def _broadcast_int(dist, value: int) -> int:
    import torch

    device: Any = "cpu"
    try:
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
    except Exception:
        pass
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())


def resolve_attempt(run_id: str, *, attempt: int | None = None, url: str | None = None,
                    token: str | None = None, location: str | None = None,
                    restored: Any = None, spool_dir: str | None | bool = None,
                    s3_client=None, timeout: float = 2.0, distributed: bool = True) -> int:
    """The attempt number of this launch of ``run_id`` (module doc: the rule).

    attempt: an explicit number (returned as is). url, token: the server (source d).
    location: the run's checkpoint location (source b). restored: the restored generation
    (source a). spool_dir: root of the spool and state file (default ``default_spool_dir()``;
    ``False``: no state file). distributed: rank 0 decides and broadcasts when
    ``torch.distributed`` is initialised (a collective; every rank must call this).
    Never raises: on an unexpected error it logs and falls back to this process's own view."""
    if attempt is not None:
        return int(attempt)
    env = env_attempt()
    if env is not None:
        return env
    dist = _dist() if distributed else None
    path = None if spool_dir is False else state_path(
        run_id, spool_dir if isinstance(spool_dir, str) and spool_dir else None)
    try:
        if dist is not None and dist.get_world_size() > 1:
            value = -1
            if dist.get_rank() == 0:
                try:
                    value, seen = next_attempt(run_id, url=url, token=token, location=location,
                                               restored=restored, spool_dir=spool_dir,
                                               s3_client=s3_client, timeout=timeout)
                    log.info("recoverydash: run %s attempt %d (seen: %s)", run_id, value, seen)
                    if path:
                        with _Locked(path):
                            _record(path, value, None)
                except Exception as e:  # still take part in the broadcast
                    log.warning("recoverydash: attempt decision failed: %r", e)
                    value = -1
            value = _broadcast_int(dist, value)
            if value >= 0:
                return value
            return restart_floor()
        # One process, or processes without torch.distributed: agree through the state file.
        key = _launch_key() if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 else None
        if path is None:
            value, seen = next_attempt(run_id, url=url, token=token, location=location,
                                       restored=restored, spool_dir=False, s3_client=s3_client,
                                       timeout=timeout)
            return value
        with _Locked(path):
            doc = _read_state(path)
            got = (doc.get("launches") or {}).get(key) if key is not None else None
            if isinstance(got, dict) and isinstance(got.get("attempt"), int):
                return got["attempt"]  # another process of this launch decided already
            value, seen = next_attempt(run_id, url=url, token=token, location=location,
                                       restored=restored, spool_dir=spool_dir,
                                       s3_client=s3_client, timeout=timeout)
            log.info("recoverydash: run %s attempt %d (seen: %s)", run_id, value, seen)
            _record(path, value, key)
            return value
    except Exception as e:
        log.warning("recoverydash: attempt number could not be decided (%r); using %d", e,
                    restart_floor())
        return restart_floor()
