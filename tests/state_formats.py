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
