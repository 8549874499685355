"""Which generation to restore: ``restore_plan`` asks the server (docs/ingest-v1.md#restore-plan)
after sending the run's spool, and lets storage decide (``select_restorable``) when the server
cannot: it is down or errs, has not decided yet, or a commit it has not heard of is still
spooled. A run the server has never heard of is a fresh start.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints.objects import StorageError, resolve_location
from recoverydash.checkpoints.selection import select_restorable
from recoverydash.sdk import faults, fetch
from recoverydash.sdk.guard import log
from recoverydash.sdk.transport import api_url

#: Seconds ``restore_plan`` waits for undecided newer generations when the call gives no
#: ``wait_undecided_s`` (unset: 0, no wait). A failure drill sets it for its launches
#: (``recoverydash.sdk.drill``, ``--wait-undecided``), the way a careful trainer would wait.
WAIT_UNDECIDED_ENV = "RECOVERYDASH_WAIT_UNDECIDED_S"


def restore_plan(url: str | None, token: str | None, run_id: str, *,
                 location: str | None = None, world_size: int | None = None,
                 dataset_version: str | None = None, config_digest: str | None = None,
                 timeout: float = 5.0, s3_client: Any = None,
                 spool_dir: str | bool | None = None,
                 wait_undecided_s: float | None = None) -> dict:
    """Which generation to load: the server's answer (``GET /api/v1/runs/{run_id}/restore-plan``,
    docs/ingest-v1.md#restore-plan) when it answers within ``timeout`` seconds and knows enough,
    else ``select_restorable(location)`` (a storage check).

    First the run's spool (``<spool_dir>/<run_id>/``; None: ``default_spool_dir()``, False: none)
    is sent (``client.send_spool``, within half of ``timeout``): the events a killed attempt
    could not send, its last ``checkpoint_committed`` above all, reach the server before the
    question, which then gets what is left of ``timeout``. Storage decides instead of the server
    (``source: "storage"``), with a warning saying why, when:

    - the server answers 409 but lists a generation it has not decided (status ``committed`` or
      ``pending``: not verified yet, a worker behind, storage unverified): warning
      ``server_undecided``. The generations it did decide against (``rejected``, ``abandoned``,
      restorable only outside the live lineage) are never chosen from storage (``decided``);
    - the spool still holds a ``checkpoint_committed`` newer than the server's answer (another
      generation at the same update or above the one named, or, with a 409, one the server did
      not decide against), or files it could not read in time: warning ``spool_commit_unsent``.

    A 409 listing only decided generations is a fresh start from the server. When the spool
    could not be sent whole but holds no newer commit, the server's answer stands with the
    warning ``spool_unsent`` (how many events it has not heard of). When the server is down or
    errs: ``server_unreachable`` / ``server_error``, storage decides.

    A server's answer that lists newer generations not decided yet (its ``newer_undecided``,
    docs/definitions.md#newer-undecided: committed but not verified, or pending) keeps the
    server's choice and carries the warning ``newer_undecided`` naming them: resuming now redoes
    the updates after the named one should one of them prove restorable. With
    ``wait_undecided_s`` > 0 (None: ``$RECOVERYDASH_WAIT_UNDECIDED_S``, else 0: no wait),
    while the answer lists a ``committed`` one
    (a ``pending`` one waits for a manifest that a dead attempt may never write), the question
    is asked again (after 0.5 s, doubling to 5 s) for at most that many seconds in all; the last
    answer taken stands (one that fails, or is not a plan, ends the wait and is not taken).

    Returns ``{"source": "server" | "storage" | "none", "generation_id": str | None,
    "update": int | None, "logger_rewind_update": int | None, "committed_at",
    "objects": [Object], "cursor": [Cursor], "warnings": [{"code", "detail"}],
    "rejected": [...], "attempt": int | None, "newer_undecided": [{"generation_id", "update",
    "status"}]}`` (the last only from the server, else empty); ``generation_id`` None means
    nothing is restorable (fresh start); ``logger_rewind_update`` is the update to rewind
    loggers to (docs/definitions.md#logger-rewind-update: W&B
    ``resume_from=f"{wandb_id}?_step={u}"``, TensorBoard ``purge_step=u + 1``), None on a fresh
    start; ``attempt`` is the attempt that wrote the generation (from its manifest), for
    ``init(..., restored=plan)``. Never raises: a restart must never wait for the dashboard:
    the server's part ends within ``timeout`` + ``wait_undecided_s`` seconds (the storage check
    itself is not bounded by them). Under a drill the answer is traced (``faults.on_plan``), so
    the drill report says what the resumed launch was told."""
    wait = _seconds(os.environ.get(WAIT_UNDECIDED_ENV) if wait_undecided_s is None
                    else wait_undecided_s)
    plan = _restore_plan(url, token, run_id, location=location, world_size=world_size,
                         dataset_version=dataset_version, config_digest=config_digest,
                         timeout=timeout, s3_client=s3_client, spool_dir=spool_dir,
                         wait_undecided_s=wait)
    plan.setdefault("newer_undecided", [])
    faults.on_plan(plan, wait)
    return plan


@dataclass
class _Unsent:
    """What the spool still held after ``send_spool``: ``events`` not sent, the newest
    ``commit`` among them (``spool.newest_spooled_commit``) and ``unread`` files."""

    events: int
    commit: dict | None
    unread: int
    stopped: str

    def newer_than(self, generation_id: str | None, update: int | None,
                   decided: dict) -> str | None:
        """Why the spool may hold a commit newer than the server's answer (None: it does not).
        ``generation_id`` / ``update``: the generation the server named (None: a 409 whose
        decided rejections are ``decided``)."""
        if self.unread:
            return (f"{self.unread} spooled batch(es) could not be read within the timeout; "
                    "they may hold a newer commit")
        c = self.commit
        if c is None or c.get("generation_id") in decided:
            return None
        if generation_id is None:
            return (f"the spool holds the commit of {c.get('generation_id')} (update "
                    f"{c.get('update')}), which the server has not heard of")
        cu = c.get("update")
        if c.get("generation_id") != generation_id and cu is not None and update is not None \
                and cu >= update:
            return (f"the spool holds the commit of {c.get('generation_id')} (update {cu}), "
                    f"newer than the server's {generation_id} (update {update})")
        return None


def _send_spool_first(url, token, run_id, spool_dir, budget: float,
                      read_until: float) -> _Unsent | None:
    """Send the run's spool (``client.send_spool`` within ``budget`` seconds); when some of it
    is left, read the newest commit it holds (until ``read_until``, a ``time.monotonic()``).
    None when nothing is left unsent."""
    from recoverydash.sdk.resend import send_spool
    from recoverydash.sdk.spool import newest_spooled_commit

    sent = send_spool(url, token, run_id, spool_dir=spool_dir, timeout=budget)
    if not sent.left or not sent.folder:
        return None
    commit, unread = newest_spooled_commit(sent.folder, deadline=read_until)
    return _Unsent(sent.left, commit, unread, sent.stopped)


def _unsent_warning(unsent: _Unsent | None) -> list[dict]:
    if unsent is None:
        return []
    return [{"code": "spool_unsent",
             "detail": f"{unsent.events} spooled event(s) of this run are not on the server "
                       f"({unsent.stopped or 'not sent'}); none is a commit newer than its "
                       "answer"}]


def _malformed_plan(body) -> str | None:
    """What is wrong with a 2xx restore-plan answer (docs/ingest-v1.md#restore-plan: an object
    naming a generation by a non-empty string ``generation_id`` at an integer ``update`` >= 0,
    with ``objects``, ``cursor`` and ``warnings`` lists, each warning an object), or None when
    it has that shape. A malformed answer is not taken as the plan: storage decides."""
    if not isinstance(body, dict):
        return f"the answer is {type(body).__name__}, not an object"
    gid, update = body.get("generation_id"), body.get("update")
    if not isinstance(gid, str) or not gid:
        return f"generation_id is {gid!r}, not a generation's id"
    if not isinstance(update, int) or isinstance(update, bool) or update < 0:
        return f"update is {update!r}, not an update number"
    for key in ("objects", "cursor", "warnings"):
        if body.get(key) is not None and not isinstance(body[key], list):
            return f"{key} is {type(body[key]).__name__}, not a list"
    if any(not isinstance(w, dict) for w in body.get("warnings") or []):
        return "warnings holds an item that is not an object"
    return None


def _newer_undecided(body: dict) -> list[dict]:
    """The extension ``newer_undecided`` of a 200 plan (docs/ingest-v1.md#restore-plan): its
    entries naming a generation (non-empty string id) at an integer update above the plan's,
    with status ``committed`` or ``pending`` (the core's ``UNDECIDED``), in the order given, at
    most the core's ``NEWER_UNDECIDED_SHOWN`` (what a server sends). Missing (an older server)
    or malformed: ``[]``; an entry that is not one is dropped. Never a reason to refuse the
    plan."""
    from recoverydash.recovery.figures import NEWER_UNDECIDED_SHOWN, UNDECIDED

    items, named = body.get("newer_undecided"), body.get("update")
    if not isinstance(items, list):
        return []
    out = []
    for g in items:
        if not isinstance(g, dict):
            continue
        gid, update, status = g.get("generation_id"), g.get("update"), g.get("status")
        if isinstance(gid, str) and gid and isinstance(update, int) \
                and not isinstance(update, bool) and isinstance(named, int) and update > named \
                and status in UNDECIDED:
            out.append({"generation_id": gid, "update": update, "status": status})
    return out[:NEWER_UNDECIDED_SHOWN]


def _newer_warning(plan: dict, waited: float | None) -> dict:
    newer = plan["newer_undecided"]
    shown = ", ".join(f"{g['generation_id']} (update {g['update']}, {g['status']})"
                      for g in newer[:5]) + (f" and {len(newer) - 5} more" if len(newer) > 5
                                             else "")
    return {"code": "newer_undecided", "detail": (
        f"the server names {plan['generation_id']} (update {plan['update']}) while newer "
        f"generations are not decided yet: {shown}"
        + (f" (still so after waiting {waited:.1f} s)" if waited is not None else "")
        + f"; resuming now redoes the updates after {plan['update']} should one prove "
          "restorable")}


def _seconds(value) -> float:
    """``wait_undecided_s`` as seconds: a finite number > 0, else 0 (no wait; logged when it
    was something else than 0 or None)."""
    try:
        seconds = float(value or 0.0)
    except (TypeError, ValueError):
        seconds = float("nan")
    if seconds == seconds and 0.0 <= seconds < float("inf"):
        return seconds
    log.warning("recoverydash: wait_undecided_s=%r is not a number of seconds; not waiting",
                value)
    return 0.0


def _server_plan(body: dict, unsent, location, s3_client) -> dict:
    """The plan from a server's 200 ``body`` (checked by ``_malformed_plan``)."""
    from recoverydash.recovery.figures import logger_rewind_update

    return {"source": "server", "generation_id": body.get("generation_id"),
            "update": body.get("update"),
            "logger_rewind_update": body.get("logger_rewind_update",
                                             logger_rewind_update(body)),
            "committed_at": body.get("committed_at"),
            "objects": body.get("objects") or [],
            "cursor": body.get("cursor") or [],
            "warnings": (body.get("warnings") or []) + _unsent_warning(unsent),
            "rejected": [],
            "attempt": _manifest_attempt(location, body.get("generation_id"), s3_client),
            "newer_undecided": _newer_undecided(body)}


def _wait_for_undecided(plan: dict, req, unsent, location, s3_client, wait_s: float) -> dict:
    """Ask again (``req``) while ``plan`` lists a ``committed`` generation in
    ``newer_undecided``, for at most ``wait_s`` seconds in all; returns the last answer taken,
    with the warning ``newer_undecided`` when it still lists one. Never raises."""
    t0 = time.monotonic()
    deadline, pause, waited = t0 + wait_s, 0.5, None
    while wait_s > 0 and any(g["status"] == "committed" for g in plan["newer_undecided"]):
        left = deadline - time.monotonic()
        if left <= 0.05:
            break
        time.sleep(min(pause, left - 0.05))
        pause = min(pause * 2, 5.0)
        waited = time.monotonic() - t0
        try:
            status, body = fetch.get_json(req, max(0.05, deadline - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - the answer already taken stands
            log.warning("recoverydash: asking the restore plan again failed: %r", e)
            break
        if not 200 <= status < 300 or _malformed_plan(body) or (
                unsent and unsent.newer_than(body.get("generation_id"), body.get("update"), {})):
            break
        plan = _server_plan(body, unsent, location, s3_client)
        waited = time.monotonic() - t0
    if plan["newer_undecided"]:
        plan["warnings"] = plan["warnings"] + [_newer_warning(plan, waited)]
    return plan


@dataclass
class _Asked:
    """What asking the server left for storage to decide with: ``warnings`` (why storage
    decides), ``decided`` (the generations the server decided against, ``{generation_id:
    [reason]}``) and ``unknown_run`` (the server has no such run: a first launch)."""

    warnings: list = field(default_factory=list)
    decided: dict = field(default_factory=dict)
    unknown_run: bool = False


def _fresh_start(source: str, warnings: list, rejected: list | None = None) -> dict:
    return {"source": source, "generation_id": None, "update": None,
            "logger_rewind_update": None, "committed_at": None, "objects": [], "cursor": [],
            "warnings": warnings, "rejected": rejected or [], "attempt": None}


def _restore_plan(url, token, run_id, *, location, world_size, dataset_version, config_digest,
                  timeout, s3_client, spool_dir, wait_undecided_s=0.0) -> dict:
    t0 = time.monotonic()
    asked = _Asked()
    if location:
        try:
            location = resolve_location(location)
        except StorageError:
            pass  # select_restorable says so below
    if url:
        query = {k: v for k, v in (("world_size", world_size), ("dataset_version", dataset_version),
                                   ("config_digest", config_digest)) if v is not None}
        try:
            plan = _ask_server(url, token, run_id, query, location, s3_client, spool_dir,
                               timeout, t0, wait_undecided_s, asked)
        except Exception as e:  # noqa: BLE001 - an answer of a shape nothing expected
            asked.warnings.append({"code": "server_malformed",
                                   "detail": f"the answer could not be read: {e!r}"[:300]})
            plan = None
        if plan is not None:
            return plan
    if not location:
        if asked.unknown_run:  # the server has never heard of the run: a first launch
            return _fresh_start("server", [])
        return _fresh_start("none", asked.warnings + [
            {"code": "no_location", "detail": "no storage location to fall back to"}])
    return _storage_plan(location, world_size, dataset_version, s3_client, asked)


def _ask_server(url, token, run_id, query: dict, location, s3_client, spool_dir, timeout: float,
                t0: float, wait_undecided_s, asked: _Asked) -> dict | None:
    """The server's plan (its spool sent first), or None when storage decides (``asked`` then
    says why)."""
    unsent = None
    try:
        unsent = _send_spool_first(url, token, run_id, spool_dir, timeout / 2, t0 + 0.6 * timeout)
    except Exception as e:  # noqa: BLE001 - the question goes on without it
        log.warning("recoverydash: the spool was not sent before the restore plan: %r", e)
    endpoint = api_url(url, f"runs/{urllib.parse.quote(run_id, safe='')}/restore-plan") + (
        f"?{urllib.parse.urlencode(query)}" if query else "")
    req = urllib.request.Request(endpoint, headers={"Authorization": f"Bearer {token or ''}",
                                                    "Accept": "application/json"})
    try:
        # the whole answer within what is left of timeout
        status, body = fetch.get_json(req, max(0.05, t0 + timeout - time.monotonic()))
    except Exception as e:  # noqa: BLE001 - unreachable, too slow, too large, not JSON
        asked.warnings.append({"code": "server_unreachable", "detail": repr(e)[:300]})
        return None
    if status == 409:
        return _no_restorable(body, unsent, asked)
    if status == 404 and isinstance(body, dict) and body.get("error") == "not_found":
        asked.unknown_run = True  # docs/ingest-v1.md: no such run in the token's project
        return None
    if not 200 <= status < 300:
        asked.warnings.append({"code": "server_error", "detail": _refusal(status, body,
                                                                           endpoint)})
        return None
    malformed = _malformed_plan(body)
    body = body if isinstance(body, dict) else {}
    newer = None if malformed or not unsent else \
        unsent.newer_than(body.get("generation_id"), body.get("update"), {})
    if malformed:
        asked.warnings.append({"code": "server_malformed", "detail": malformed})
    elif newer:
        asked.warnings.append({"code": "spool_commit_unsent", "detail": newer})
    else:
        return _wait_for_undecided(_server_plan(body, unsent, location, s3_client), req, unsent,
                                   location, s3_client, _seconds(wait_undecided_s))
    return None


def _refusal(status: int, body, endpoint: str) -> str:
    """``server_error``'s detail: the status, and what it most likely means."""
    detail = f"restore-plan answered {status}"
    if status in (401, 403):
        return detail + (": the token is refused (no, an unknown or a revoked token)"
                         if status == 401 else ": the token lacks the read scope")
    if not isinstance(body, dict):  # a web server's page, not the API's JSON
        return detail + f" from {endpoint}, which is not the recoverydash API (its base URL?)"
    listed = body.get("errors")
    errors: list[Any] = listed if isinstance(listed, list) else []
    said = "; ".join(str(e.get("message"))[:200] for e in errors[:3] if isinstance(e, dict))
    return detail + (f": {said}" if said else "")


def _no_restorable(body, unsent, asked: _Asked) -> dict | None:
    """A 409 (``no_restorable_generation``): the server's fresh start, or None when storage
    decides (a generation the server has not decided, or a newer commit still spooled)."""
    from recoverydash.recovery.figures import UNDECIDED

    body = body if isinstance(body, dict) else {}
    named = body.get("rejected")  # a malformed answer decides nothing
    listed = [g for g in named if isinstance(g, dict)] if isinstance(named, list) else []
    undecided = [g for g in listed if g.get("status") in UNDECIDED]
    asked.decided = {g["generation_id"]: [r for r in g["reasons"] if isinstance(r, dict)]
                     if isinstance(g.get("reasons"), list) else []
                     for g in listed if isinstance(g.get("generation_id"), str)
                     and g.get("status") not in UNDECIDED}
    newer = unsent.newer_than(None, None, asked.decided) if unsent else None
    if undecided:
        asked.warnings.append({"code": "server_undecided", "detail": (
            "the server found no restorable generation but has not decided "
            + ", ".join(f"{g.get('generation_id')} ({g.get('status')})" for g in undecided[:10])
            + (f" and {len(undecided) - 10} more" if len(undecided) > 10 else "")
            + "; storage decides")})
        return None
    if newer:
        asked.warnings.append({"code": "spool_commit_unsent", "detail": newer})
        return None
    return _fresh_start("server", _unsent_warning(unsent), listed)


def _storage_plan(location: str, world_size, dataset_version, s3_client, asked: _Asked) -> dict:
    """Storage decides (``select_restorable``), never choosing what the server decided against.
    For a run the server does not know, a storage holding no generation is a plain fresh start;
    one holding some is said (``server_unknown_run``)."""
    from recoverydash.recovery.figures import logger_rewind_update

    try:
        sel = select_restorable(location, world_size=world_size,
                                dataset_version=dataset_version, s3_client=s3_client,
                                decided=asked.decided)
    except Exception as e:  # noqa: BLE001 - said in the plan
        return _fresh_start("storage", asked.warnings + [{"code": "storage_error",
                                                          "detail": repr(e)[:300]}])
    warnings = asked.warnings
    if asked.unknown_run and sel.generations:
        warnings = warnings + [{"code": "server_unknown_run", "detail": (
            f"the server has no such run (its events never reached it, or it is another "
            f"server), while storage holds {len(sel.generations)} generation(s); storage "
            "decides")}]
    m = sel.manifest or {}
    return {"source": "storage", "generation_id": sel.generation_id, "update": sel.update,
            "logger_rewind_update": logger_rewind_update(sel) if sel.generation_id else None,
            "committed_at": m.get("committed_at"), "objects": m.get("objects") or [],
            "cursor": sel.cursor, "warnings": warnings,
            "rejected": [{"generation_id": g.generation_id, "reasons": g.reasons}
                         for g in sel.rejected],
            "attempt": m.get("attempt") if isinstance(m.get("attempt"), int) else None}


def _manifest_attempt(location: str | None, generation_id: str | None, s3_client) -> int | None:
    """The ``attempt`` recorded in a generation's manifest at ``location`` (None when unknown)."""
    if not location or not generation_id:
        return None
    try:
        m = storage.read_manifest(storage.manifest_uri(location, generation_id),
                                  s3_client=s3_client)
    except Exception:
        return None
    a = m.get("attempt")
    return a if isinstance(a, int) and not isinstance(a, bool) else None


__all__ = ["restore_plan"]
