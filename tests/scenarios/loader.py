"""Load a worked recovery scenario and write its checkpoint objects to a folder.

A scenario file (``tests/scenarios/<name>.json``, see README.md there) holds a run as wire events
(docs/ingest-v1.md) whose object URIs are placeholders ``obj://<key>``, the objects themselves as
``{key: {"size": bytes, "fate": ...}}``, and ``expect``: what the analysis must conclude.

:func:`load` writes every object under ``objects_dir`` and answers the events with each
``obj://<key>`` turned into the ``file://`` URI of the file it wrote, so that the storage verifier
checks real files. An object's bytes are a pure function of its key: the 32-byte sha256 of the key,
repeated and cut to ``size``. The digests in the manifests were computed that way, so an object of
fate ``ok`` verifies. The other fates break it on purpose:

* ``missing``: no file is written (``object_missing``);
* ``truncated``: an empty file (``size_mismatch``);
* ``corrupt``: the right size with every byte inverted (``digest_mismatch``).

Run as a script for a summary: ``python tests/scenarios/loader.py s1_resume_at_checkpoint_exact``.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Scenario names (file stems), in order.
NAMES = tuple(sorted(p.stem for p in HERE.glob("s[0-9]*_*.json")))
FATES = ("ok", "missing", "truncated", "corrupt")
PLACEHOLDER = "obj://"


def path_of(name: str) -> Path:
    """The JSON file of scenario ``name`` (with or without ``.json``); ValueError if unknown."""
    stem = name.removesuffix(".json")
    if stem not in NAMES:
        raise ValueError(f"no scenario {name!r}; known: {', '.join(NAMES)}")
    return HERE / f"{stem}.json"


def read(name: str) -> dict:
    """The scenario document as stored: ``id``, ``note``, ``events``, ``objects``, ``expect``."""
    return json.loads(path_of(name).read_text())


def object_bytes(key: str, size: int, fate: str = "ok") -> bytes | None:
    """The bytes an object of this key, size and fate has on disk (None: no file at all)."""
    if fate not in FATES:
        raise ValueError(f"unknown fate {fate!r} of object {key!r}; expected one of {FATES}")
    if fate == "missing":
        return None
    if fate == "truncated":
        return b""
    block = hashlib.sha256(key.encode()).digest()
    data = (block * (size // len(block) + 1))[:size]
    return bytes(b ^ 0xFF for b in data) if fate == "corrupt" else data


def _with_file_uris(value, root: Path):
    if isinstance(value, dict):
        return {k: _with_file_uris(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_file_uris(v, root) for v in value]
    if isinstance(value, str) and value.startswith(PLACEHOLDER):
        return (root / value[len(PLACEHOLDER):]).as_uri()
    return value


def load(name: str, objects_dir) -> tuple[list, dict]:
    """``(events, expect)`` of scenario ``name``, its objects written under ``objects_dir``
    (created if needed). ``events`` are wire events with ``file://`` URIs; ``expect`` is the
    scenario's expectations (README.md). Raises ValueError for an unknown name or fate."""
    doc = read(name)
    root = Path(objects_dir).resolve()
    for key, spec in doc["objects"].items():
        data = object_bytes(key, int(spec["size"]), spec.get("fate", "ok"))
        if data is None:
            continue
        target = root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return _with_file_uris(doc["events"], root), doc["expect"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: loader.py NAME  (one of: {', '.join(NAMES)})", file=sys.stderr)
        return 2
    doc = read(argv[0])
    fates: dict = {}
    for spec in doc["objects"].values():
        fates[spec.get("fate", "ok")] = fates.get(spec.get("fate", "ok"), 0) + 1
    print(f"{argv[0]} (run {doc['id']}): {doc['note']}")
    print(f"{len(doc['events'])} events, objects by fate {fates}")
    print("expect:", json.dumps(doc["expect"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
