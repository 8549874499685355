"""The embedded broker (kombu's filesystem transport, ``workers.broker``): a message file that
is empty or not JSON is moved aside with a log line and the next message is read; a message is
written under a name no consumer takes until it is complete."""

from __future__ import annotations

import logging

from kombu import Connection

from workers.broker import install


def connection(folder) -> Connection:
    """A connection to a broker in ``folder`` (kombu keeps declared exchanges per process: each
    test uses its own queue name)."""
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    install()
    return Connection("filesystem://", transport_options={
        "data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control"),
        "store_processed": False})


def test_an_empty_or_corrupt_message_file_is_dropped_and_the_next_is_read(tmp_path, caplog):
    with connection(tmp_path) as conn:
        q = conn.SimpleQueue("jobs")
        (tmp_path / "queue" / "0_torn.jobs.msg").write_bytes(b"")
        (tmp_path / "queue" / "00_corrupt.jobs.msg").write_bytes(b"\xff{not json")
        q.put({"task": "real"})
        with caplog.at_level(logging.ERROR, logger="workers.broker"):
            message = q.get(timeout=5)
        assert message.payload == {"task": "real"}
        message.ack()
        q.close()
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == ["00_corrupt.jobs.msg",
                                                                  "0_torn.jobs.msg"]
    dropped = [r.getMessage() for r in caplog.records]
    assert len(dropped) == 2 and all(m.startswith("broker: dropped an undecodable message file "
                                                  "of queue jobs") for m in dropped)
    assert list((tmp_path / "processed").iterdir()) == []


def test_a_message_being_written_is_not_taken(tmp_path):
    with connection(tmp_path) as conn:
        q = conn.SimpleQueue("writes")
        (tmp_path / "queue" / "0_half.writes.msg.part").write_bytes(b"{\"body\"")
        q.put({"task": "whole"})
        assert q.get(timeout=5).payload == {"task": "whole"}
        assert [p.name for p in (tmp_path / "queue").iterdir()] == ["0_half.writes.msg.part"]
        q.close()
