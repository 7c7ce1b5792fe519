"""Host certificates renewed while the server runs (mtgpu.sshd.hostcerts), with a
clock the test moves; and the scoped @cert-authority line (mtgpu.cluster.identity)."""

from __future__ import annotations

import asyncio
import doctest
import logging
import time

import asyncssh
import pytest

from mtgpu.cli import admin as admin_cli
from mtgpu.cluster import identity
from mtgpu.cluster.identity import ClusterIdentity, check_host_patterns, known_hosts_patterns
from mtgpu.errors import ValidationError
from mtgpu.install import setup
from mtgpu.sshd import hostcerts
from mtgpu.sshd.hostcerts import HostCertificates

KEY = "s3cret-cluster-key-0123456789"
DAY = 86400


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


@pytest.mark.parametrize("module", [identity, hostcerts])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_admin_gives_the_host_patterns():
    line = "@cert-authority [a1]:2222,[10.0.0.5]:2222 ssh-ed25519 AAAA mtgpu-lab"
    assert (
        admin_cli.scoped_known_hosts(line, "gpu*.lab,10.0.0.*")
        == "@cert-authority gpu*.lab,10.0.0.* ssh-ed25519 AAAA mtgpu-lab"
    )


@pytest.fixture(scope="module")
def host_key():
    return asyncssh.generate_private_key("ssh-ed25519")


def _certs(host_key, clock, validity=30 * DAY):
    ident = ClusterIdentity.derive("lab", KEY)
    return HostCertificates(
        ident, [host_key], lambda: ["alpha", "127.0.0.1"], now=clock.now, validity=validity
    )


def test_renewed_once_a_third_of_the_validity_is_left(host_key):
    clock = Clock(1_000_000_000)
    c = _certs(host_key, clock)
    first = c.pairs[0][1]
    assert c.valid_before == 1_000_000_000 + 30 * DAY
    clock.t += 19 * DAY  # 11 days left
    assert not c.check() and c.pairs[0][1] is first
    clock.t += 2 * DAY  # 9 days left: less than a third
    assert c.check()
    assert c.valid_before == clock.t + 30 * DAY and c.pairs[0][1] is not first
    assert c.status()["warning"] == "" and c.status()["error"] == ""


def test_a_clock_step_either_way_renews(host_key):
    clock = Clock(1_000_000_000)
    c = _certs(host_key, clock)
    clock.t += 400 * DAY  # long past the end: one look sees it
    assert c.check() and c.valid_after < clock.t < c.valid_before
    clock.t -= 10 * DAY  # back before the certificate's start
    assert c.check() and c.valid_after < clock.t < c.valid_before
    assert not c.check()  # nothing left to do


def test_a_failed_renewal_is_logged_and_shown(host_key, caplog):
    clock = Clock(1_000_000_000)
    c = _certs(host_key, clock)

    class Broken:
        def update(self, **kwargs):
            raise ValueError("no room")

    c.attach(Broken())
    before = c.pairs
    clock.t += 25 * DAY
    with caplog.at_level(logging.ERROR, logger="mtgpu.sshd"):
        assert not c.check()
    assert c.pairs is before and c.error == "no room"
    assert "cannot renew this member's host certificate: no room" in caplog.text
    st = c.status()
    assert st["warning"] == "expires 2001-10-09 01:46 UTC and was not renewed (no room)"
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="mtgpu.sshd"):
        c.check()  # retried; the error is not logged again within the hour
    assert caplog.text == ""
    clock.t += 6 * DAY
    assert c.status()["warning"].startswith("EXPIRED")


def test_status_lines(host_key):
    clock = Clock(1_000_000_000)
    c = _certs(host_key, clock)
    (line,) = setup.host_certificate_lines(c.status())
    assert line.startswith("host cert:  ") and "valid until 2001-10-09" in line and "WARNING" not in line
    clock.t += 25 * DAY  # no renewal ran: near expiry
    (line,) = setup.host_certificate_lines(c.status())
    assert line.startswith("host cert:  WARNING: expires 2001-10-09") and "not renewed" in line
    assert setup.host_certificate_lines(None) == []


def test_renewed_certificate_reaches_a_running_listener(host_key):
    """update() on the running acceptor: a client connecting afterwards is shown the
    new certificate (one of ten days ago is refused, one of now accepted); a
    connection made before keeps working."""
    clock = Clock(time.time())
    ident = ClusterIdentity.derive("lab", KEY)

    class Server(asyncssh.SSHServer):
        def begin_auth(self, username):
            return False  # no authentication: enough to see the host key

    def answer(process):
        process.stdout.write("ok\n")
        process.exit(0)

    async def scenario():
        c = HostCertificates(ident, [host_key], lambda: ["127.0.0.1"], now=clock.now, validity=3 * DAY)
        acceptor = await asyncssh.create_server(
            Server, "127.0.0.1", 0, server_host_keys=list(c.pairs), process_factory=answer
        )
        c.attach(acceptor)
        port = acceptor.get_port()
        kh = ([], [ident.host_ca.convert_to_public()], [])
        try:
            async with asyncssh.connect("127.0.0.1", port, known_hosts=kh, username="x") as old:
                clock.t -= 10 * DAY  # a step back before the start: signed again, for then
                assert c.check()
                with pytest.raises(asyncssh.HostKeyNotVerifiable):
                    await asyncssh.connect("127.0.0.1", port, known_hosts=kh, username="x")
                clock.t = time.time()  # and forward: past the end, signed again for now
                assert c.check()
                async with asyncssh.connect("127.0.0.1", port, known_hosts=kh, username="x") as new:
                    assert (await new.run("x")).stdout == "ok\n"
                assert (await old.run("x")).stdout == "ok\n"  # the old connection goes on
        finally:
            acceptor.close()
            await acceptor.wait_closed()

    asyncio.run(scenario())


def test_known_hosts_patterns_and_line():
    members = [
        {"name": "alpha", "address": "10.0.0.5:2222"},
        {"name": "beta", "address": "beta.lab:22"},
        {"name": "gamma", "address": "0.0.0.0:2222"},
    ]
    pats = known_hosts_patterns(members)
    assert pats == ["[alpha]:2222", "[10.0.0.5]:2222", "beta", "beta.lab", "[gamma]:2222"]
    line = ClusterIdentity.derive("lab", KEY).known_hosts_line(pats)
    marker, hosts, kind, _body, comment = line.split(" ")
    assert marker == "@cert-authority" and hosts == ",".join(pats) and "*" not in hosts
    assert kind == "ssh-ed25519" and comment == "mtgpu-lab"


@pytest.mark.parametrize("bad", ["*", "", "a,,b", "a b", "[*]:2222", "*.*", "gpu1,*"])
def test_host_patterns_that_trust_every_host_or_are_malformed_are_refused(bad):
    with pytest.raises(ValueError):
        check_host_patterns(bad)
    with pytest.raises(ValidationError, match="--hosts"):
        admin_cli.scoped_known_hosts("@cert-authority a ssh-ed25519 AAAA mtgpu-lab", bad)
    with pytest.raises(ValueError):
        ClusterIdentity.derive("lab", KEY).known_hosts_line([bad] if bad else [])
