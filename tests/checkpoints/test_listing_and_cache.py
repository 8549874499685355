"""One listing per check, and each DCP ``.metadata`` decoded once per version of the file: what
the benchmark's speed rests on must not change an answer."""

from __future__ import annotations

import os

import pytest

from recoverydash.checkpoints.formats import check, dcp
from recoverydash.checkpoints.formats.store import Tree

from .conftest import dcp_save

pytest.importorskip("torch")


def test_a_rewritten_metadata_is_decoded_again(ckpt):
    dcp_save(ckpt, 10)
    assert check(str(ckpt)).generations[0].status == "restorable"
    before = len(dcp._SUMMARIES)
    assert check(str(ckpt)).generations[0].status == "restorable"
    assert len(dcp._SUMMARIES) == before  # the same file: its summary, not a second decode
    (ckpt / "step-10" / ".metadata").write_bytes(b"not a pickle at all")
    g = check(str(ckpt)).generations[0]
    assert g.status == "rejected"
    assert [r["code"] for r in g.reasons] == ["component_missing", "schema_unsupported"]


def test_the_objects_of_a_bulk_added_save_are_the_files_in_order(ckpt):
    path = dcp_save(ckpt, 10)
    g = check(str(ckpt)).generations[0]
    assert [o.path for o in g.objects] == ["step-10/__0_0.distcp", "step-10/.metadata"]
    o = g.objects[0]
    assert (o.uri, o.shard, o.size, o.declared_size) == (
        f"file://{ckpt}/step-10/__0_0.distcp", "rank0",
        os.path.getsize(os.path.join(path, "__0_0.distcp")), o.size)
    assert set(g.components) >= {"model", "optimizer"}


def test_the_listing_names_children_and_links_without_empty_folders(ckpt, tmp_path):
    (ckpt / "a" / "b").mkdir(parents=True)
    (ckpt / "a" / "b" / "f").write_bytes(b"x" * 3)
    (ckpt / "empty" / "deeper").mkdir(parents=True)
    target = tmp_path / "target"
    target.write_bytes(b"12345")
    os.symlink(target, ckpt / "a" / "link")
    tree = Tree(str(ckpt))
    assert sorted(tree.files) == ["a/b/f", "a/link"]
    assert tree.files["a/link"].size == 5
    assert tree.children() == ["a"]
    assert tree.children("a") == ["b", "link"]
    assert tree.links == {"a/link"}
    tree.drop(["a/link"])
    assert tree.children("a") == ["b"] and tree.links == set()


def _counting_decodes(monkeypatch) -> list:
    dcp.clear_cache()
    decoded = []
    real = dcp.read_dcp_metadata

    def counted(data):
        decoded.append(len(data))
        return real(data)

    monkeypatch.setattr(dcp, "read_dcp_metadata", counted)
    return decoded


def test_it_decodes_one_metadata_of_a_job_s_saves_that_differ_only_in_storage_meta(
        ckpt, monkeypatch):
    for step in (10, 20, 30):
        dcp_save(ckpt, step)
    decoded = _counting_decodes(monkeypatch)
    result = check(str(ckpt))
    assert [(g.generation_id, g.status) for g in result.generations] == [
        ("step-30", "restorable"), ("step-20", "restorable"), ("step-10", "restorable")]
    assert len(decoded) == 1  # step-20 and step-30: the same bytes before their save id
    assert [o.path for o in result.generations[0].objects] == [
        "step-30/__0_0.distcp", "step-30/.metadata"]
    decoded.clear()
    check(str(ckpt))
    assert decoded == []  # the in-process cache, by URI, size and time


def test_it_decodes_a_save_whose_storage_item_differs_and_rejects_it(ckpt, monkeypatch):
    import pickle

    dcp_save(ckpt, 10)
    dcp_save(ckpt, 20)
    meta = ckpt / "step-20" / ".metadata"
    md = pickle.loads(meta.read_bytes())  # torch's own classes, for the test only
    last = max(md.storage_data.values(), key=lambda i: i.offset + i.length)
    last.length += 4  # the file's last item now reaches past its end
    meta.write_bytes(pickle.dumps(md))
    decoded = _counting_decodes(monkeypatch)
    result = check(str(ckpt))
    assert len(decoded) == 2
    g20, g10 = result.generations
    assert (g20.status, [r["code"] for r in g20.reasons]) == ("rejected", ["size_mismatch"])
    assert "step-20/__0_0.distcp" in g20.reasons[0]["detail"]
    assert (g10.status, result.restorable.generation_id) == ("restorable", "step-10")


def test_it_decodes_a_metadata_cut_in_its_storage_meta_and_rejects_it(ckpt, monkeypatch):
    dcp_save(ckpt, 10)
    dcp_save(ckpt, 20)
    meta = ckpt / "step-20" / ".metadata"
    meta.write_bytes(meta.read_bytes()[:-30])  # the save id and what follows it lost
    decoded = _counting_decodes(monkeypatch)
    result = check(str(ckpt))
    assert len(decoded) == 2
    g20 = result.generations[0]
    assert g20.status == "rejected"
    assert [r["code"] for r in g20.reasons] == ["component_missing", "size_mismatch"]
    assert result.restorable.generation_id == "step-10"


def test_it_reads_a_metadata_tail_as_pickletools_does_whole_cut_or_altered(ckpt, monkeypatch):
    from recoverydash.checkpoints.formats import readers

    with open(os.path.join(dcp_save(ckpt, 10), ".metadata"), "rb") as f:
        data = f.read()
    variants = [data, data[:-1], data + b"\x00", data[:-20]]
    for k in range(len(data) - 300, len(data)):  # every byte of the tail altered in turn
        variants.append(data[:k] + bytes([data[k] ^ 0x5A]) + data[k + 1:])
    direct = [readers.dcp_layout(v) for v in variants]
    monkeypatch.setattr(readers, "_plain_tail", lambda data, v: None)  # pickletools.genops
    assert direct == [readers.dcp_layout(v) for v in variants]
    assert direct[0] is not None and direct[1] is None and direct[2] is None


def test_it_adds_a_save_s_files_as_columns_with_each_missing_or_short_file_found(ckpt):
    path = dcp_save(ckpt, 10)
    dcp_save(ckpt, 20)
    shard = os.path.join(path, "__0_0.distcp")
    size = os.path.getsize(shard)
    os.truncate(shard, size - 1)
    old, new = check(str(ckpt)).generations[1], check(str(ckpt)).generations[0]
    assert (new.status, old.status) == ("restorable", "rejected")
    assert old.reasons == [{"code": "size_mismatch", "detail": f"step-10/__0_0.distcp: "
                            f"{size - 1} bytes, its structure declares {size} (truncated)"}]
    assert [(o.path, o.size, o.declared_size) for o in old.objects] == [
        ("step-10/__0_0.distcp", size - 1, size), ("step-10/.metadata",
                                                   os.path.getsize(path + "/.metadata"), None)]
    os.remove(shard)
    old = check(str(ckpt)).generations[1]
    assert old.reasons == [{"code": "object_missing",  # rank0 is still the .metadata's shard
                            "detail": "step-10/__0_0.distcp: no such file"}]
    assert [o.path for o in old.objects] == ["step-10/.metadata"]
