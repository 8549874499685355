"""One listing per check, and each DCP ``.metadata`` decoded once per version of the file: what
the benchmark's speed rests on must not change an answer."""

from __future__ import annotations

import os

import pytest

from recoverydash.formats import check, dcp
from recoverydash.formats.store import Tree

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
