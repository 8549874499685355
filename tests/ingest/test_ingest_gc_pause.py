"""api.no_cycle_collection: the cyclic collector is paused while an ingest request is parsed,
validated and stored, and comes back as it was after it (also after a refusal, and with
several threads inside at once)."""

from __future__ import annotations

import gc
import threading

import pytest

from ingest_support import post, update
from recoverydash.ingest import api


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_it_pauses_the_collector_inside_and_restores_it_after():
    with api.no_cycle_collection():
        assert gc.isenabled() is False
        with api.no_cycle_collection():
            assert gc.isenabled() is False
        assert gc.isenabled() is False
    assert gc.isenabled() is True


def test_it_restores_the_collector_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with api.no_cycle_collection():
            1 / 0
    assert gc.isenabled() is True


def test_it_leaves_a_disabled_collector_disabled():
    gc.disable()
    with api.no_cycle_collection():
        assert gc.isenabled() is False
    assert gc.isenabled() is False


def test_the_last_of_several_threads_to_leave_turns_it_back_on():
    inside, leave = threading.Barrier(5), threading.Event()
    seen = []

    def work():
        with api.no_cycle_collection():
            inside.wait()
            leave.wait()
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    inside.wait()
    assert gc.isenabled() is False
    leave.set()
    for t in threads:
        t.join()
    assert seen == [False] * 4  # each thread looks before it leaves
    assert gc.isenabled() is True


def test_a_request_leaves_the_collector_on_accepted_or_refused(client, ingest_token, monkeypatch):
    during = []
    real = api.ingest_batch

    def spy(auth, events):
        during.append(gc.isenabled())
        return real(auth, events)

    monkeypatch.setattr(api, "ingest_batch", spy)
    r = post(client, ingest_token, [update("a", 1)])
    assert r.status_code == 202
    assert during == [False]
    assert gc.isenabled() is True
    r = post(client, ingest_token, [{"type": "update_committed"}])
    assert r.status_code == 400
    assert gc.isenabled() is True


class _Cycle:
    """An object in a reference cycle (only the cyclic collector frees it)."""

    def __init__(self):
        self.me = self


def test_overlapping_requests_past_the_bound_collect_cycles_while_paused(monkeypatch):
    import weakref

    now = [1000.0]
    monkeypatch.setattr(api, "_clock", lambda: now[0])
    with api.no_cycle_collection():  # a request that holds the pause throughout
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        del cycle
        with api.no_cycle_collection():  # another one, within the bound: no collection
            now[0] += api.MAX_PAUSE_S
        assert gone() is not None and gc.isenabled() is False
        with api.no_cycle_collection():  # one that leaves past the bound collects
            now[0] += 0.001
        assert gone() is None
        assert gc.isenabled() is False  # still paused for the request inside
        cycle = _Cycle()
        again = weakref.ref(cycle)
        del cycle
        with api.no_cycle_collection():  # the bound started again at that collection
            now[0] += api.MAX_PAUSE_S
        assert again() is not None
    assert gc.isenabled() is True


def test_the_wsgi_module_freezes_what_django_loaded():
    import importlib
    import sys

    gc.unfreeze()
    sys.modules.pop("recoverydash.wsgi", None)
    try:
        importlib.import_module("recoverydash.wsgi")
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
