"""Command line: ``python -m recoverydash.sdk check LOCATION [--world-size N] [--json]``.

Lists the generations published under LOCATION (a folder, relative or absolute, ``file:///dir`` or
``s3://bucket/prefix``), newest first, with their status (``restorable``, ``rejected``,
``committed``) and reasons (docs/definitions.md#generation-status), after verifying every object in
storage. Exit status: 0 when one generation is restorable, 1 when none is (or the location cannot be
listed), 2 on usage errors.

The check covers storage only: it does not see the data ledger, so ``data_cursor_mismatch`` and
``stale_state`` (which need the server's ledger and the digests of every generation it knows) are
not checked; a recommended generation says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from recoverydash.sdk.checkpoint import select_restorable
from recoverydash.storage.objects import DEFAULT_FULL_HASH_MAX_BYTES, StorageError, make_s3_client

OFFLINE_NOTE = ("note: checked storage only (manifests, shards, components, sizes, digests); "
                "the data ledger was not checked. data_cursor_mismatch and stale_state need the "
                "server: ask its restore plan (GET /api/v1/runs/RUN/restore-plan) when it is up.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m recoverydash.sdk",
                                description="recoverydash trainer tools (work without the server)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="list generations in storage and say which can be restored")
    c.add_argument("location", help="folder, file:///dir or s3://bucket/prefix")
    c.add_argument("--world-size", type=int, default=None,
                   help="ranks of the restarting job (a different manifest world size rejects)")
    c.add_argument("--dataset-version", default=None, help="dataset version the job reads")
    c.add_argument("--components", default=None,
                   help="required components, comma-separated (default: the manifest's, else "
                        "model,optimizer,scheduler,rng,data_progress)")
    c.add_argument("--max-hash-bytes", type=int, default=DEFAULT_FULL_HASH_MAX_BYTES,
                   help="objects larger than this are checked by size only when storage holds "
                        "no sha256 (bytes)")
    c.add_argument("--endpoint-url", default=None, help="S3 endpoint (MinIO, moto...)")
    c.add_argument("--region", default=None, help="S3 region")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 restorable, 1 none, 2 usage error)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
        return int(e.code or 0)
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
    try:
        sel = select_restorable(args.location, world_size=args.world_size,
                                dataset_version=args.dataset_version,
                                required_components=components, s3_client=s3, verify_all=True,
                                full_hash_max_bytes=args.max_hash_bytes)
    except StorageError as e:
        print(f"error: cannot list {args.location}: {e}", file=sys.stderr)
        return 1
    if args.json:
        doc = sel.to_dict()
        doc["checked"] = "storage"  # the data ledger was not checked (see OFFLINE_NOTE)
        doc["note"] = OFFLINE_NOTE
        print(json.dumps(doc, indent=1))
    else:
        if not sel.generations:
            print(f"no manifest under {args.location}")
        for g in sel.generations:
            mark = "*" if sel.restorable is g else " "
            print(f"{mark} {g.generation_id:<24} update {g.update!s:>8}  {g.status}")
            for r in g.reasons:
                print(f"      {r['code']}: {r['detail']}")
        if sel.restorable:
            print(f"restore {sel.generation_id} (update {sel.update}), cursor "
                  f"{json.dumps(sel.cursor)}")
            print(OFFLINE_NOTE)
        else:
            print("no restorable generation")
    return 0 if sel.restorable else 1


if __name__ == "__main__":
    sys.exit(main())
