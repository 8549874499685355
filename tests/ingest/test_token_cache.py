"""The token look-up cache (recoverydash.ingest.auth.live_token, RECOVERYDASH_TOKEN_CACHE_S):
one query fewer per request, revocation honoured within the TTL (fake clock), at once in the
process that revokes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from ingest_support import post, update

from recoverydash.ingest import auth
from recoverydash.runs.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    auth.forget_tokens()
    yield now
    auth.forget_tokens()


def token_queries(queries) -> int:
    return sum('"runs_apitoken"' in q["sql"] and q["sql"].startswith("SELECT")
               for q in queries.captured_queries)


def test_a_live_token_is_looked_up_once_per_ttl(client, project, clock, settings):
    settings.RECOVERYDASH_TOKEN_CACHE_S = 5.0
    _, raw = ApiToken.issue(project, ["ingest"])
    seen = []
    for t, eid in ((1000.0, "a"), (1004.9, "b"), (1005.0, "c"), (1006.0, "d")):
        clock[0] = t
        with CaptureQueriesContext(connection) as q:
            assert post(client, raw, [update(eid, 1)]).status_code == 202
        seen.append(token_queries(q))
    assert seen == [1, 0, 1, 0]  # looked up at 1000, reused at 1004.9, again at 1005 (5 s)


def test_a_token_revoked_elsewhere_is_refused_once_the_ttl_has_passed(client, project, clock,
                                                                      settings):
    settings.RECOVERYDASH_TOKEN_CACHE_S = 5.0
    token, raw = ApiToken.issue(project, ["ingest"])
    assert post(client, raw, [update("a", 1)]).status_code == 202
    # another process (or the dashboard's queryset update): no signal reaches this one
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=token.created_at)
    clock[0] = 1004.0
    assert post(client, raw, [update("b", 1)]).status_code == 202  # within the documented 5 s
    clock[0] = 1005.0
    assert post(client, raw, [update("c", 1)]).status_code == 401
    clock[0] = 1005.1
    assert post(client, raw, [update("d", 1)]).status_code == 401  # refusals are not cached


def test_a_revoke_in_this_process_is_refused_at_once(client, project, clock, settings):
    settings.RECOVERYDASH_TOKEN_CACHE_S = 5.0
    token, raw = ApiToken.issue(project, ["ingest"])
    assert post(client, raw, [update("a", 1)]).status_code == 202
    token.revoke()
    assert post(client, raw, [update("b", 1)]).status_code == 401
    other, raw2 = ApiToken.issue(project, ["ingest"])
    assert post(client, raw2, [update("c", 1)]).status_code == 202
    other.delete()
    assert post(client, raw2, [update("d", 1)]).status_code == 401


def test_a_ttl_of_zero_looks_every_request_up(client, project, clock, settings):
    settings.RECOVERYDASH_TOKEN_CACHE_S = 0
    _, raw = ApiToken.issue(project, ["ingest"])
    for eid in ("a", "b"):
        with CaptureQueriesContext(connection) as q:
            assert post(client, raw, [update(eid, 1)]).status_code == 202
        assert token_queries(q) == 1


def test_a_revoke_from_the_dashboard_is_refused_at_once(client, project, clock, settings):
    """The dashboard's revoke (a queryset update: no post_save) empties the cache too."""
    from recoverydash.dashboard.actions import revoke_token

    settings.RECOVERYDASH_TOKEN_CACHE_S = 5.0
    token, raw = ApiToken.issue(project, ["ingest"])
    assert post(client, raw, [update("a", 1)]).status_code == 202
    assert revoke_token(project, token.pk)
    assert post(client, raw, [update("b", 1)]).status_code == 401


def test_a_look_up_racing_a_revoke_does_not_cache_the_token_it_read(project, clock, settings,
                                                                      monkeypatch):
    """A look-up that read the token live while this process revoked it does not put it back
    into the emptied cache (the next request looks it up again and is refused)."""
    settings.RECOVERYDASH_TOKEN_CACHE_S = 5.0
    token, raw = ApiToken.issue(project, ["ingest"])
    real = ApiToken.authenticate

    def racing(value):
        found = real(value)  # live when read ...
        token.revoke()  # ... revoked by another thread of this process before it is cached
        return found

    monkeypatch.setattr(ApiToken, "authenticate", staticmethod(racing))
    assert auth.live_token(raw) is not None
    monkeypatch.setattr(ApiToken, "authenticate", staticmethod(real))
    assert auth.live_token(raw) is None
