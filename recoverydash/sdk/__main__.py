"""Command line: ``python -m recoverydash.sdk check LOCATION [--format F] [--json] [--hash]``,
``python -m recoverydash.sdk resend --run RUN`` and ``python -m recoverydash.sdk drill [options]
-- COMMAND`` (failure drills: ``recoverydash.sdk.drill``).

``resend`` sends what a run's spool holds (``<spool_dir>/<run_id>/``) and offers the events in its
``rejected/`` folder again (``recoverydash.sdk.resend``): what to run once a token the server
refused (401, 403: the trainer kept every event in its spool) is right. ``--url`` / ``--token``
default to ``$RECOVERYDASH_URL`` / ``$RECOVERYDASH_TOKEN``, ``--spool-dir`` to the SDK's default
spool. Exit status: 0 when nothing of the run is left unsent, 1 otherwise (the token still
refused, the server unreachable, events it refuses again), 2 on usage errors.

Lists the checkpoint generations under LOCATION (a folder, relative or absolute, ``file:///dir``
or ``s3://bucket/prefix``): the newest restorable one first, then every generation newest first
with its status (``restorable``, ``rejected``, ``committed``, ``pending``, ``abandoned``) and
reasons (docs/definitions.md#generation-status). ``--format`` (default ``auto``, told from the
layout) reads our own manifests (``recoverydash``: every object verified against its recorded
size and sha256) or a framework's folders with no change to the trainer: ``dcp`` (torchtitan
``step-N``), ``hf`` (``checkpoint-N``), ``lightning`` (``.ckpt``), ``deepspeed``, ``megatron``,
``orbax``; each applies the completeness rule printed with the result (docs/formats.md).
``--hash`` reads every file to record its sha256 (progress on stderr). Exit status: 0 when one
generation is restorable, 1 when none is (or the location cannot be listed, or no layout is
recognised), 2 on usage errors.

The check covers storage only: it does not see the data ledger, so ``data_cursor_mismatch`` and
``stale_state`` (which need the server's ledger and the digests of every generation it knows) are
not checked; a recommended generation says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from recoverydash.checkpoints.formats import (
    FORMATS,
    Options,
    UnknownFormat,
    check,
    progress_bar,
)
from recoverydash.checkpoints.formats.base import rfc3339
from recoverydash.checkpoints.objects import (
    StorageError,
    make_s3_client,
)

OFFLINE_NOTE = ("note: checked storage only (manifests, shards, components, sizes, digests); "
                "the data ledger was not checked. data_cursor_mismatch and stale_state need the "
                "server: ask its restore plan (GET /api/v1/runs/RUN/restore-plan) when it is up.")
ADOPTED_NOTE = ("note: a structural check of files a framework wrote: they carry no digest, so "
                "bytes inside a file are not proven intact (--hash records sha256 for later "
                "checks), nor that every part holds the state of one update; the data ledger "
                "was not checked (see docs/formats.md).")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m recoverydash.sdk",
                                description="recoverydash trainer tools (work without the server)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="list generations in storage and say which can be restored")
    c.add_argument("location", help="folder, file:///dir or s3://bucket/prefix")
    c.add_argument("--format", default="auto", choices=("auto", *FORMATS),
                   help="checkpoint layout (default: told from the folder)")
    c.add_argument("--world-size", type=int, default=None,
                   help="ranks of the restarting job (a different saved world size rejects)")
    c.add_argument("--dataset-version", default=None,
                   help="dataset version the job reads (recoverydash manifests)")
    c.add_argument("--components", default=None,
                   help="required components, comma-separated (default: the manifest's or the "
                        "format's rule)")
    c.add_argument("--hash", action="store_true",
                   help="read every file and record its sha256 (progress on stderr)")
    c.add_argument("--max-hash-bytes", type=int, default=None,
                   help="recoverydash manifests, an opt-out: objects larger than this (bytes) "
                        "that no checksum stored by S3 decides are not read, and their "
                        "generation is not verified (committed, storage_unverified); default: "
                        "every sha256 is read")
    c.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO, moto...)")
    c.add_argument("--region", default=None, help="S3 region")
    c.add_argument("--json", action="store_true", help="print JSON instead of words")
    r = sub.add_parser("resend", help="send a run's spooled and rejected events (once the token "
                       "the server refused is right)")
    r.add_argument("--run", required=True, help="the run id")
    r.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"),
                   help="server base URL (default $RECOVERYDASH_URL)")
    r.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with the ingest scope (default $RECOVERYDASH_TOKEN)")
    r.add_argument("--spool-dir", default=None,
                   help="root of the spool (default $RECOVERYDASH_SPOOL_DIR, else "
                        "~/.cache/recoverydash/spool)")
    r.add_argument("--timeout", type=float, default=600.0,
                   help="seconds for the spool in all (default 600)")
    r.add_argument("--no-rejected", action="store_true",
                   help="leave the rejected/ folder alone")
    from recoverydash.sdk import drill
    drill.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (``check``: 0 restorable, 1 none;
    ``resend``: 0 nothing left, 1 something left; 2 usage error)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
        return int(e.code or 0)
    if args.command == "drill":
        from recoverydash.sdk import drill
        return drill.main(args)
    if args.command == "resend":
        return _resend(args)
    return _check(args)


def _resend(args: argparse.Namespace) -> int:
    """``resend``: the run's spool, then its ``rejected/`` folder; says what is left."""
    from recoverydash.sdk.resend import resend
    from recoverydash.sdk.spool import run_folder

    if not args.url:
        print("error: no server: pass --url or set RECOVERYDASH_URL", file=sys.stderr)
        return 2
    out = resend(args.url, args.token, args.run, spool_dir=args.spool_dir,
                 timeout=args.timeout, rejected=not args.no_rejected)
    folder = out.spool.folder or run_folder(args.spool_dir, args.run)
    print(f"run {args.run}: {out.spool.sent} spooled event(s) sent, {out.spool.left} left in "
          f"{folder}" + (f" ({out.spool.stopped})" if out.spool.stopped else ""))
    if not args.no_rejected:
        print(f"rejected/: {out.rejected_sent} file(s) sent ({out.rejected_events} event(s)), "
              f"{len(out.rejected_left)} left")
        for name, status in out.rejected_left[:20]:
            print(f"  {name}: " + (f"refused again (HTTP {status})" if status is not None
                                   else "not sent (unreadable, or not tried)"))
    if out.refused is not None:
        what = "URL (--url: the server's base URL)" if out.refused == 404 else \
            "token (--token / RECOVERYDASH_TOKEN, and its ingest scope)"
        print(f"error: the server refused the {what.split(' ')[0]} (HTTP {out.refused}): "
              f"nothing was sent past it; check the {what}", file=sys.stderr)
    return 0 if out.complete else 1


def _check(args: argparse.Namespace) -> int:
    """``check LOCATION``: the generations in storage, the restorable one first."""
    if args.world_size is not None and args.world_size < 1:
        print("error: --world-size must be >= 1", file=sys.stderr)
        return 2
    components = [c for c in args.components.split(",") if c] if args.components else None
    s3 = None
    if args.location.startswith("s3://"):
        s3 = make_s3_client(args.endpoint_url, args.region)
    elif not args.location.startswith("file://"):
        if "://" in args.location:
            print(f"error: LOCATION must be a folder, file:///... or s3://...: "
                  f"{args.location!r}", file=sys.stderr)
            return 2
        args.location = os.path.abspath(args.location)  # a relative folder: from here
    options = Options(world_size=args.world_size, required_components=components,
                      dataset_version=args.dataset_version)
    try:
        result = check(args.location, format=args.format, options=options, s3_client=s3,
                       hash_files=args.hash, progress=progress_bar,
                       full_hash_max_bytes=args.max_hash_bytes)
    except UnknownFormat as e:
        empty = " (0 files)" in str(e)
        if args.json:
            print(json.dumps({"location": args.location, "format": None, "restorable": None,
                              "generations": [], "error": str(e)}, indent=1))
        else:
            print(f"no manifest under {args.location}" if empty else str(e))
            print("no restorable generation")
        return 1
    except StorageError as e:
        print(f"error: cannot list {args.location}: {e}", file=sys.stderr)
        return 1
    adopted = result.format != "recoverydash"
    note = ADOPTED_NOTE if adopted else OFFLINE_NOTE
    if args.json:
        _print_json(result, adopted, note)
    else:
        _print_words(args, result, adopted, note)
    return 0 if result.restorable else 1


def _print_json(result: Any, adopted: bool, note: str) -> None:
    doc = result.to_dict()
    best = result.restorable
    if not adopted and best is not None:
        doc["cursor"] = best.progress.get("cursor") or []
    doc["checked"] = "storage"  # the data ledger was not checked (see the note)
    doc["note"] = note
    print(json.dumps(doc, indent=1))


def _print_words(args: argparse.Namespace, result: Any, adopted: bool, note: str) -> None:
    best = result.restorable
    if best is not None:
        when = rfc3339(best.committed_at) or "time unknown"
        line = f"restore {best.generation_id} (update {best.update}, committed {when})"
        if not adopted:
            line = (f"restore {best.generation_id} (update {best.update}), cursor "
                    f"{json.dumps(best.progress.get('cursor') or [])}")
        print(line)
    else:
        print("no restorable generation")
    print(f"format {result.format}: {result.rule}")
    if not result.generations:
        print(f"no manifest under {args.location}" if not adopted
              else f"no {result.format} generation under {args.location}")
    width = max([len(g.generation_id) for g in result.generations] + [12])
    for g in result.generations:
        mark = "*" if g is best else " "
        print(f"{mark} {g.generation_id:<{width}} update {g.update!s:>8}  {g.status}")
        for r in g.reasons:
            print(f"      {r['code']}: {r['detail']}")
        for n in g.notes:
            print(f"      note: {n}")
    if args.hash and adopted:
        print(f"sha256 recorded for {sum(len(g.objects) for g in result.generations)} file(s), "
              f"{result.hashed_bytes} bytes read (--json lists them)")
    print(note)


if __name__ == "__main__":
    sys.exit(main())
