"""A ledger state written in format 4 (one zlib-compressed JSON document, the per-update times
base64 in it), as the release before format 5 wrote it, for the tests that load old states."""
from __future__ import annotations

import base64
import json
import zlib


def format_4(ledger) -> bytes:
    """``ledger`` (a recovery.Ledger) serialised in format 4, from its format 5 bytes: the same
    head with each attempt's ``times`` as ``[[chunk index, base64 of the chunk]]`` in it."""
    from array import array

    from recoverydash.recovery.ledger import _MAGIC, TIME_SHIFT

    data = ledger.to_bytes()
    assert data.startswith(_MAGIC)
    size = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 8
    doc = json.loads(zlib.decompress(data[start:start + size]))
    section, offset = data[start + size:], 0
    width = 8 << TIME_SHIFT
    for item in doc["attempts"].values():
        indices = array("q")
        indices.frombytes(section[offset:offset + 8 * item["times"]])
        offset += 8 * item["times"]
        chunks = []
        for index in indices:
            chunks.append([index, base64.b64encode(section[offset:offset + width]).decode()])
            offset += width
        item["times"] = chunks
    assert offset == len(section)
    doc["format"] = 4
    del doc["byteorder"]
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 1)


def inputs_format_3(attempts: dict, generations: dict, statuses: dict, judged: dict,
                    judged_for) -> bytes:
    """``Analysis.inputs`` in format 3 (runs.analysis.StoredInputs before format 4), as that
    release wrote it: ``RDI3``, the head's length (4 bytes, big-endian), the head
    (zlib-compressed JSON: attempts, statuses, judgements, the chunk table ``[[chunk,
    length]]``), then the generation entries in chunks of 32 pks, each zlib-compressed JSON."""
    chunks: dict = {}
    for pk in generations:
        chunks.setdefault(pk // 32, []).append(pk)
    parts, table = [], []
    for chunk in sorted(chunks):
        raw = zlib.compress(json.dumps({pk: generations[pk] for pk in sorted(chunks[chunk])},
                                       separators=(",", ":")).encode(), 6)
        parts.append(raw)
        table.append([chunk, len(raw)])
    head = zlib.compress(json.dumps({"format": 3, "attempts": attempts, "statuses": statuses,
                                     "judged": judged, "judged_for": judged_for,
                                     "chunks": table}, separators=(",", ":")).encode(), 6)
    return b"".join([b"RDI3", len(head).to_bytes(4, "big"), head, *parts])
