"""The counting parts of the connection limits, the login penalties and the log
filter, driven directly with plain numbers and an injected clock."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from mtgpu.api.dispatcher import Caller
from mtgpu.api.jobs import submission_key
from mtgpu.api.unix import ApiConnections
from mtgpu.errors import ApiError
from mtgpu.lograte import RepeatFilter
from mtgpu.sshd.limits import ConnectionLimits, Held, LimitReached, Penalties


def test_penalties_key_on_source_and_user():
    now = [0.0]
    p = Penalties(3, 60, clock=lambda: now[0])
    for _ in range(3):
        p.failed("127.0.0.1", "mallory")
    assert p.penalized("127.0.0.1", "mallory") == 60
    # Another local user, and the same user from elsewhere, are not penalized.
    assert p.penalized("127.0.0.1", "alice") == 0
    assert p.penalized("10.0.0.7", "mallory") == 0
    now[0] = 60.5
    assert p.penalized("127.0.0.1", "mallory") == 0


def test_a_success_clears_only_that_users_count():
    p = Penalties(2, 60, clock=lambda: 0.0)
    p.failed("127.0.0.1", "a")
    p.failed("127.0.0.1", "b")
    p.succeeded("127.0.0.1", "a")
    p.failed("127.0.0.1", "a")
    p.failed("127.0.0.1", "b")
    assert not p.penalized("127.0.0.1", "a") and p.penalized("127.0.0.1", "b")


def _limits(**over):
    opts = SimpleNamespace(
        ssh_max_connections_per_source=2,
        ssh_max_connections_per_user=2,
        ssh_max_sessions_per_user=2,
        ssh_max_forwards_per_user=2,
    )
    for k, v in over.items():
        setattr(opts, k, v)
    return ConnectionLimits(lambda: opts, "gpu01")


def test_a_count_past_its_limit_names_the_key_and_closing_gives_it_back():
    limits = _limits()
    a, b, c = Held(limits), Held(limits), Held(limits)
    a.take("session", "ann")
    b.take("session", "ann")
    with pytest.raises(LimitReached, match="SSH_MAX_SESSIONS_PER_USER is 2"):
        c.take("session", "ann")
    c.take("session", "bob")  # another user is not affected
    a.release_all()
    c.take("session", "ann")
    assert limits.counts["session"]["ann"] == 2


def test_a_session_gives_its_count_back_once_when_its_channel_closes():
    limits = _limits()
    held = Held(limits)
    closed = []
    held.take("forward", "ann")
    session = SimpleNamespace(connection_lost=closed.append)
    held.release_on_close("forward", "ann", session)
    session.connection_lost(None)
    session.connection_lost(None)
    assert closed == [None, None] and limits.counts["forward"]["ann"] == 0
    held.release_all()
    assert limits.counts["forward"]["ann"] == 0


def test_api_connections_per_uid_and_in_all():
    conns = ApiConnections(lambda: (2, 3))
    assert conns.take(20001) is None and conns.take(20001) is None
    why = conns.take(20001)
    assert why is not None and "API_MAX_CONNECTIONS_PER_USER is 2" in why
    assert conns.take(20002) is None
    why = conns.take(20003)
    assert why is not None and "API_MAX_CONNECTIONS is 3" in why
    conns.give(20001)
    assert conns.take(0) is None  # root: counted in the total only


def _record(msg="refused %s", args=("x",)):
    return logging.LogRecord("mtgpu.api", logging.WARNING, "", 0, msg, args, None)


def test_repeated_lines_are_summarized():
    now = [0.0]
    f = RepeatFilter(burst=3, window=60, clock=lambda: now[0])
    kept = [f.filter(_record(args=(str(i),))) for i in range(1000)]
    assert kept.count(True) == 3
    other = _record("another kind %s")
    assert f.filter(other)  # other lines still pass
    now[0] = 60.0
    r = _record()
    assert f.filter(r) and "997 more like this" in r.getMessage()


def test_one_record_is_decided_once_for_every_handler():
    f = RepeatFilter(burst=1, window=60, clock=lambda: 0.0)
    r = _record()
    assert f.filter(r) and f.filter(r)  # the second handler sees the same decision
    assert not f.filter(_record())


def test_submission_keys_are_scoped_to_the_caller_and_bounded():
    ann, bob = Caller("ann", 20001, False, "socket"), Caller("bob", 20002, False, "socket")
    assert submission_key(ann, "t") != submission_key(bob, "t")
    assert submission_key(ann, None) is None
    for hostile in ("x" * 65, "a b", "k\n", "../k", "ключ"):
        with pytest.raises(ApiError, match="1 to 64 letters, digits"):
            submission_key(ann, hostile)
