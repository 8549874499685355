"""Reading a checkpoint's pickle costs a bounded amount before anything is built
(``recoverydash.checkpoints.formats.pickle_scan``): a zip of 64 KiB declaring 64 MiB of NONE,
a 16 MiB NONE flood, a memo index of 2**31, a list copied by 20,000 calls and a tuple whose
hash reads 2**41 items are all refused with the limit named, within 64 MiB of Python memory;
and a pickle naming ``os.system`` and ``eval`` is ``refused_globals``, never restorable, through
``check --format`` and the SDK's load of a per-rank file."""

from __future__ import annotations

import io
import json
import os
import pickle
import tracemalloc
import zipfile

import pytest

from recoverydash.checkpoints.formats.pickle_scan import PICKLE_BUDGET, ScanCost, scan_pickle
from recoverydash.checkpoints.formats.readers import UnreadableFile, read_pickle
from recoverydash.sdk.__main__ import main as cli

MIB = 1024 * 1024
PWNED = "/tmp/recoverydash-pickle-budget-pwned"


def write_ckpt(path, data_pkl: bytes) -> None:
    """A ``torch.save``-shaped zip holding ``data_pkl`` (deflated: small on disk)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/version", "3\n")


def none_flood(n: int) -> bytes:
    return b"\x80\x02" + b"N" * n + b"."


def check_json(folder, capsys) -> tuple[int, dict]:
    code = cli(["check", str(folder), "--format", "lightning", "--json"])
    return code, json.loads(capsys.readouterr().out)


def traced_peak(fn):
    """``fn()``'s result and the most Python memory it held at once (bytes)."""
    tracemalloc.start()
    try:
        got = fn()
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_64_kib_ckpt_declaring_64_mib_of_none_is_refused_unread(tmp_path, capsys):
    folder = tmp_path / "lightning"
    folder.mkdir()
    write_ckpt(folder / "epoch=0-step=10.ckpt", none_flood(64 * MIB))
    assert os.path.getsize(folder / "epoch=0-step=10.ckpt") < 100 * 1024
    (code, doc), peak = traced_peak(lambda: check_json(folder, capsys))
    assert code == 1 and doc["restorable"] is None
    gen = doc["generations"][0]
    assert gen["status"] == "rejected"
    assert gen["reasons"] == [{"code": "schema_unsupported", "detail": (
        "epoch=0-step=10.ckpt: data.pkl declares 67108867 bytes, over the 67108864 a pickle "
        "may have: not read")}]
    assert peak < 64 * MIB


def test_a_16_mib_none_flood_is_refused_at_the_stack_limit_within_bounded_memory(tmp_path,
                                                                                  capsys):
    folder = tmp_path / "lightning"
    folder.mkdir()
    write_ckpt(folder / "epoch=0-step=20.ckpt", none_flood(16 * MIB))
    (code, doc), peak = traced_peak(lambda: check_json(folder, capsys))
    assert code == 1
    assert doc["generations"][0]["reasons"] == [{"code": "schema_unsupported", "detail": (
        "epoch=0-step=20.ckpt: pickle of 16777219 bytes: 1052671 items on the stack after "
        "1052672 opcodes (byte 1052673), over the 1048576 allowed: not read")}]
    # the 16 MiB pickle itself, read from the zip, and the scan's stack of a million ids
    assert peak < 64 * MIB


def test_a_memo_index_far_ahead_is_refused_before_the_unpickler_sizes_its_memo():
    with pytest.raises(UnreadableFile) as e:
        read_pickle(b"\x80\x02Nr\xff\xff\xff\x7f.")
    assert (e.value.code, e.value.detail) == (
        "schema_unsupported", "pickle of 9 bytes: memo index 2147483647 at byte 3, with 0 set: "
                              "not read")


def test_a_list_copied_by_twenty_thousand_calls_is_refused_by_the_words_it_would_build():
    # L = [None] * 100_000, memoised; then 20,000 times tuple(L): 2 billion items (16 GB)
    data = (b"\x80\x02]q\x00(" + b"N" * 100_000 + b"e"
            + b"cbuiltins\ntuple\nh\x00\x85R0" * 20_000 + b".")
    assert len(data) < 600_000
    with pytest.raises(UnreadableFile) as e:
        traced_peak(lambda: read_pickle(data))
    assert e.value.code == "schema_unsupported"
    assert "bytes of objects after" in e.value.detail
    assert e.value.detail.endswith(f"over the {PICKLE_BUDGET.words * 8} allowed: not read")
    _, peak = traced_peak(lambda: pytest.raises(UnreadableFile, read_pickle, data))
    assert peak < 64 * MIB


def test_a_dict_key_whose_hash_reads_two_to_the_41_items_is_refused():
    # T0 = "x"; T(i) = (T(i-1), T(i-1)) through the memo; {T40: None}
    data = b"\x80\x02}X\x01\x00\x00\x00xq\x00"
    for i in range(1, 41):
        data += b"h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"\x86q" + bytes([i])
    data += b"Ns."
    with pytest.raises(UnreadableFile) as e:
        read_pickle(data)
    # 2**41 - 2 items read by hashing T40, 5 words each, and 384 words of objects (EMPTY_DICT
    # 9, the string 7, 41 BINPUT 2, 80 BINGET 1, 40 TUPLE2 5, NONE 1, SETITEM 5)
    assert (e.value.code, e.value.detail) == (
        "schema_unsupported", "pickle of 294 bytes: about 87960930225072 bytes of objects after "
                              "167 opcodes (byte 294), over the 268435456 allowed: not read")


def test_an_ordinary_pickle_costs_what_its_opcodes_say():
    data = pickle.dumps({"a": [1, 2, 3], "b": ("x", 2.5)}, protocol=2)
    # PROTO 0, EMPTY_DICT 9, three BINPUT and two more 2 each, two MARK 1, three BINUNICODE
    # of one character 7, EMPTY_LIST 8, three BININT1 5, APPENDS 3 items and SETITEMS 4 at 5,
    # BINFLOAT 4, TUPLE2 5, STOP 0
    assert scan_pickle(data) == ScanCost(ops=22, stack=0, words=111)
    assert read_pickle(data).obj == {"a": [1, 2, 3], "b": ("x", 2.5)}


class _System:
    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


class _Eval:
    def __reduce__(self):
        return (eval, (f"open({PWNED!r}, 'w')",))


def evil_ckpt(path) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"state_dict": {"w": torch.zeros(2)}, "optimizer_states": [{}],
                "lr_schedulers": [], "loops": {}, "epoch": 0, "global_step": 10,
                "callbacks": {"x": _System()}, "hyper_parameters": {"y": _Eval()}}, path)


def test_a_ckpt_naming_os_system_and_eval_is_refused_globals_never_restorable(tmp_path, capsys):
    if os.path.exists(PWNED):
        os.remove(PWNED)
    folder = tmp_path / "lightning"
    folder.mkdir()
    evil_ckpt(folder / "epoch=0-step=10.ckpt")
    code, doc = check_json(folder, capsys)
    assert not os.path.exists(PWNED)
    assert code == 1 and doc["restorable"] is None
    gen = doc["generations"][0]
    assert gen["status"] == "rejected"
    assert gen["refused_globals"] == ["builtins.eval", "posix.system"]
    assert gen["reasons"] == [{"code": "refused_globals", "detail": (
        "epoch=0-step=10.ckpt names 2 global(s) a checkpoint loader must not import: "
        "builtins.eval, posix.system (read as inert placeholders: nothing ran; "
        "torch.load(weights_only=True) refuses them too)")}]


def test_the_sdk_reads_a_rank_file_through_the_same_budget_and_refuses_its_globals(tmp_path):
    torch = pytest.importorskip("torch")
    from recoverydash.sdk.load import _read_rank_file

    if os.path.exists(PWNED):
        os.remove(PWNED)
    plain = tmp_path / "plain.pt"
    torch.save({"last_epoch": 3, "rng": torch.get_rng_state()}, plain)
    assert _read_rank_file(str(plain))["last_epoch"] == 3
    evil = tmp_path / "evil.pt"
    torch.save({"last_epoch": 3, "x": _System()}, evil)
    with pytest.raises(pickle.UnpicklingError, match="posix.system"):
        _read_rank_file(str(evil))  # weights_only=True: torch refuses what is not allowed
    assert not os.path.exists(PWNED)
    flood = tmp_path / "flood.pt"
    buf = io.BytesIO()
    write_ckpt(buf, none_flood(16 * MIB))
    flood.write_bytes(buf.getvalue())
    with pytest.raises(UnreadableFile, match="1052671 items on the stack"):
        _read_rank_file(str(flood))


def test_a_dcp_save_whose_tail_names_another_global_is_decoded_on_its_own(ckpt):
    """Saves of one layout are compared byte for byte up to ``storage_meta`` and by their tail's
    opcodes: the global a tail's STACK_GLOBAL imports is compared too, so a ``.metadata`` that
    differs from its neighbour only there is decoded, and its global refused."""
    pytest.importorskip("torch")
    from recoverydash.checkpoints.formats import check
    from recoverydash.checkpoints.formats.dcp import clear_cache

    from .conftest import dcp_save

    dcp_save(ckpt, 10)
    path = dcp_save(ckpt, 20)
    meta = os.path.join(path, ".metadata")
    data = open(meta, "rb").read()
    same = b"\x8c\x07pathlib\x94\x8c\x09PosixPath"
    assert data.count(same) == 1
    with open(meta, "wb") as f:
        f.write(data.replace(same, b"\x8c\x07evilmod\x94\x8c\x09EvilClass"))
    clear_cache()
    got = {g.generation_id: g for g in check(str(ckpt)).generations}
    assert got["step-10"].status == "restorable"
    assert got["step-20"].status == "rejected"
    assert got["step-20"].reasons == [{"code": "refused_globals", "detail": (
        "step-20/.metadata names 1 global(s) a checkpoint loader must not import: "
        "evilmod.EvilClass (read as inert placeholders: nothing ran; "
        "torch.load(weights_only=True) refuses them too)")}]
