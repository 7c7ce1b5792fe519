"""Fixtures of the attack suite: one real host, a victim tenant and an attacker.

Every attack goes in at the lowest layer it can reach: raw JSON lines on the API's
Unix socket (connected with the attacker's UID, which is what SO_PEERCRED reports),
raw SSH requests made with asyncssh as a client, and plain shell commands run as
the attacker. The figures (attacks tried and refused) are added up by
``tests/figures.py`` and printed at the end of the run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import tally  # noqa: E402,F401
from mtgpu_testing import Host  # noqa: E402
from security_testing import Tenant, api_socket, call  # noqa: E402,F401

#: The limits the host runs with: low, so abuse reaches them quickly.
LIMITS = {
    "USER_SUBMIT_RATE": 2,
    "USER_SUBMIT_BURST": 40,
    "USER_MAX_QUEUED_JOBS": 60,
    "SSH_MAX_STARTUPS": 20,
    "SIMULATED_CPUS": 2,
    "USER_DISK_LIMIT": "100G",
}


@pytest.fixture(scope="package")
def arena() -> Iterator[dict]:
    """A host with two tenants (``alice`` the victim, ``mallory`` the attacker) and an
    admin, all logged in once."""
    h = Host(LIMITS)
    h.start()
    people = {}
    try:
        for name, extra in (("alice", ()), ("mallory", ()), ("root_admin", ("--admin",))):
            key = h.add_user(name, None, *extra)
            r = h.ssh(name, key, "true")
            assert r.returncode == 0, r.stderr
            people[name] = Tenant(name, int(h.passwd(name)[2]), key, Path(h.passwd(name)[5]))
        yield {"host": h, **people}
    finally:
        h.cleanup()
