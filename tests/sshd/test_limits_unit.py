"""The counting parts of the connection limits, the login penalties and the log
filter, driven directly with plain numbers and an injected clock."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from mtgpu.api.dispatcher import Caller
from mtgpu.api.jobs import submission_key
from mtgpu.api.unix import ApiConnections
from mtgpu.config.options import Options, load_text, max_startups
from mtgpu.errors import ApiError, ConfigError
from mtgpu.lograte import RepeatFilter
from mtgpu.sshd.limits import ConnectionLimits, Held, LimitReached, Penalties, penalty_delay, should_drop


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
        ssh_max_startups_per_source=2,
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


def test_max_startups_drops_nothing_below_start_everything_at_full_and_ramps_between():
    """As OpenSSH's MaxStartups 10:30:100: the chance of a drop is 30% at 10 open,
    rising linearly to 100% at 100 (counted over every roll from 0 to 99)."""

    def chance(n: int, spec: str = "10:30:100") -> int:
        start, rate, full = max_startups(spec)
        return sum(should_drop(n, start, rate, full, lambda r=r: r) for r in range(100))

    assert [chance(n) for n in (0, 9, 10, 55, 99, 100, 500)] == [0, 0, 30, 65, 99, 100, 100]
    # A plain number N is N:100:N: nothing below it, everything from it.
    assert [chance(n, "3") for n in (2, 3, 4)] == [0, 100, 100]


def test_max_startups_accepts_start_rate_full_and_a_plain_number():
    assert load_text("SSH_MAX_STARTUPS: 10:30:100\n", "c.yaml").ssh_max_startups == "10:30:100"
    # YAML 1.1 would read 10:30:50 as the base-60 number 37850: it is read as written.
    assert load_text("SSH_MAX_STARTUPS: 20:30:50\n", "c.yaml").ssh_max_startups == "20:30:50"
    assert load_text("SSH_MAX_STARTUPS: '20:30:50'\n", "c.yaml").ssh_max_startups == "20:30:50"
    assert load_text("SSH_MAX_STARTUPS: 100\n", "c.yaml").ssh_max_startups == "100:100:100"
    assert max_startups(Options().ssh_max_startups) == (30, 30, 100)
    d = Options()
    assert d.ssh_max_startups_per_source == 10 and d.ssh_login_grace_time == 30


@pytest.mark.parametrize(
    "value, key, words",
    [
        ("10:30", "SSH_MAX_STARTUPS", "START:RATE:FULL such as 10:30:100, got '10:30'"),
        ("a:b:c", "SSH_MAX_STARTUPS", "START:RATE:FULL"),
        ("10:30:100:5", "SSH_MAX_STARTUPS", "START:RATE:FULL"),
        ("-5", "SSH_MAX_STARTUPS", "positive whole number"),
        ("0", "SSH_MAX_STARTUPS", "from 1"),
        ("0:30:100", "SSH_MAX_STARTUPS", "from 1"),
        ("10:0:100", "SSH_MAX_STARTUPS", "RATE is 0; it is a percentage from 1 to 100"),
        ("10:101:100", "SSH_MAX_STARTUPS", "RATE is 101"),
        ("100:30:10", "SSH_MAX_STARTUPS", "START (100) is above FULL (10)"),
        ("1:30:" + "9" * 40, "SSH_MAX_STARTUPS", "each at most"),
        ("[1, 2]", "SSH_MAX_STARTUPS", "got a list"),
        ("true", "SSH_MAX_STARTUPS", "got a boolean"),
        # The issue's own configuration: one address could hold every slot.
        ("100\nSSH_MAX_STARTUPS_PER_SOURCE: 128", "SSH_MAX_STARTUPS_PER_SOURCE", "not below the FULL"),
        (
            "5\nSSH_MAX_STARTUPS_PER_SOURCE: 5",
            "SSH_MAX_STARTUPS_PER_SOURCE",
            "set it below 5 or raise SSH_MAX_STARTUPS",
        ),
    ],
)
def test_bad_max_startups_is_one_line_naming_the_key_and_the_fix(value, key, words):
    with pytest.raises(ConfigError) as exc:
        load_text(f"SSH_MAX_STARTUPS: {value}\n", "/etc/mtgpu/mtgpu.yaml")
    msg = str(exc.value)
    assert msg.startswith("/etc/mtgpu/mtgpu.yaml:"), msg
    assert f": {key}: " in msg and words in msg and "\n" not in msg and len(msg) < 300, msg


def test_an_older_low_max_startups_still_starts_with_the_per_source_cap_below_it():
    """A configuration from before the per-address cap, with SSH_MAX_STARTUPS at 8:
    the cap it never set follows it; one that sets both too high is still refused."""
    assert load_text("SSH_MAX_STARTUPS: 8\n", "c.yaml").ssh_max_startups_per_source == 4
    assert load_text("SSH_MAX_STARTUPS: 2\n", "c.yaml").ssh_max_startups_per_source == 1
    assert load_text("SSH_MAX_STARTUPS: 100\n", "c.yaml").ssh_max_startups_per_source == 10
    with pytest.raises(ConfigError, match="SSH_MAX_STARTUPS_PER_SOURCE"):
        load_text("SSH_MAX_STARTUPS: 8\nSSH_MAX_STARTUPS_PER_SOURCE: 8\n", "c.yaml")


def test_the_penalty_delay_leaves_time_for_the_registered_key():
    assert penalty_delay(30, 6) == 1.0
    # Never so long that SSH_MAX_AUTH_TRIES refused keys eat the grace time.
    for grace, tries in ((3, 2), (5, 20), (1, 1)):
        assert penalty_delay(grace, tries) * tries <= grace / 4


def test_unauthenticated_connections_are_counted_per_source():
    limits = _limits()
    a, b, c, d = Held(limits), Held(limits), Held(limits), Held(limits)
    a.take("startup", "10.0.0.1")
    b.take("startup", "10.0.0.1")
    with pytest.raises(LimitReached, match="SSH_MAX_STARTUPS_PER_SOURCE is 2"):
        c.take("startup", "10.0.0.1")
    d.take("startup", "10.0.0.2")  # another address has its own
    a.give("startup", "10.0.0.1")  # a login gives its slot back
    c.take("startup", "10.0.0.1")


def test_disconnect_first_sends_the_reason_before_closing_channels() -> None:
    """The removal's DISCONNECT goes out before asyncssh's channel closes: the pinned
    asyncssh has the private sender it uses, and the order holds."""
    import asyncssh as _asyncssh

    from mtgpu.sshd.limits import disconnect_first

    assert callable(getattr(_asyncssh.SSHServerConnection, "_send_disconnect", None))
    said: list[tuple] = []

    class Conn:
        def _send_disconnect(self, code: int, reason: str, lang: str) -> None:
            said.append(("disconnect message", code, reason))

        def disconnect(self, code: int, reason: str) -> None:
            said.append(("channels closed, socket aborted", code, reason))

    disconnect_first(Conn(), 8, "gone")
    assert said == [("disconnect message", 8, "gone"), ("channels closed, socket aborted", 8, "gone")]
