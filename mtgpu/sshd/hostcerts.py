"""A cluster member's host certificates, renewed while the daemon runs.

Each member signs its host keys with the cluster's host CA when its SSH server
starts (mtgpu.cluster.identity, valid CERT_VALIDITY). :meth:`HostCertificates.run`
looks at the clock every CHECK_INTERVAL seconds (never one long sleep, so a clock
step is noticed) and signs them again once less than a third of the validity is left,
or when the clock moved back before a certificate's start. The new certificates go
to the running listener (``SSHAcceptor.update``): connections accepted from then on
present them; established ones keep theirs, so no session is dropped and nothing
restarts. A certificate that could not be renewed and is near its end is logged and
shown by ``mtgpu-setup status`` (the ``ssh.host_certificate`` API operation).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import asyncssh

from mtgpu.cluster.identity import CERT_BACKDATE, CERT_VALIDITY, ClusterIdentity
from mtgpu.errors import MtgpuError

log = logging.getLogger("mtgpu.sshd")

#: Seconds between looks at the clock (a float compared; nothing is signed unless due).
CHECK_INTERVAL = 10.0
#: The daemon's environment may shorten the validity (seconds), so a test sees a
#: renewal and an expiry in seconds; production never sets it.
VALIDITY_ENV = "MTGPU_HOST_CERT_VALIDITY"
MIN_VALIDITY = 30
#: A near-expiry warning is logged again after this many seconds.
WARN_EVERY = 3600.0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def configured_validity(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """CERT_VALIDITY, or the seconds that ``MTGPU_HOST_CERT_VALIDITY`` gives.

    >>> configured_validity({}) == CERT_VALIDITY, configured_validity({VALIDITY_ENV: "60"})
    (True, 60)
    >>> configured_validity({VALIDITY_ENV: "5"})
    Traceback (most recent call last):
    ...
    mtgpu.errors.MtgpuError: MTGPU_HOST_CERT_VALIDITY is '5'; give whole seconds from 30 to 2592000, or unset it
    """
    text = environ.get(VALIDITY_ENV)
    if not text:
        return CERT_VALIDITY
    if not (text.isascii() and text.isdigit() and MIN_VALIDITY <= int(text) <= CERT_VALIDITY):
        raise MtgpuError(
            f"{VALIDITY_ENV} is {text[:20]!r}; give whole seconds from {MIN_VALIDITY} to "
            f"{CERT_VALIDITY}, or unset it"
        )
    return int(text)


def due(now: float, valid_after: float, valid_before: float, validity: float) -> bool:
    """Whether certificates valid [valid_after, valid_before) need signing again at ``now``:
    less than a third of ``validity`` left (or past it), or the clock is before their start.

    >>> due(0, -300, 30, 30), due(19, -300, 30, 30), due(21, -300, 30, 30), due(-301, -300, 30, 30)
    (False, False, True, True)
    """
    return valid_before - now < validity / 3 or now < valid_after


class HostCertificates:
    """The host keys of one member with their current certificates."""

    def __init__(
        self,
        identity: ClusterIdentity,
        keys: list[asyncssh.SSHKey],
        principals: Callable[[], list[str]],
        *,
        now: Callable[[], float] | None = None,
        validity: int | None = None,
    ) -> None:
        """``now``: the wall clock the certificates are checked against (by ``ssh``
        and the other members), not the policy clock; ``validity``: seconds, by
        default configured_validity()."""
        self.identity = identity
        self.keys = keys
        self.principals = principals
        # time.time looked up at each call (a test may move the process's wall clock).
        self.now = now if now is not None else (lambda: time.time())
        self.validity = configured_validity() if validity is None else validity
        #: Seconds between looks at the clock: a tenth of the validity at most.
        self.interval = min(CHECK_INTERVAL, self.validity / 10)
        self.acceptor: Any = None  # set by attach(): the listener that presents them
        self.pairs: list[tuple[asyncssh.SSHKey, asyncssh.SSHCertificate]] = []
        self.valid_after = self.valid_before = self.signed = 0.0
        self.error = ""  # why the last renewal failed ("" once one succeeds)
        self._names: list[str] = []
        self._warned = float("-inf")
        self._sign()

    def _sign(self) -> None:
        """Sign every key again and give the new certificates to the listener; on an
        error (raised) the old certificates stay, both here and in the listener."""
        try:
            names = self.principals() or self._names
        except Exception as exc:  # noqa: BLE001 - the names found before still hold
            if not self._names:
                raise
            log.warning("host certificate: could not list this host's addresses (%s); keeping its names", exc)
            names = self._names
        now = self.now()
        pairs = [
            (k, self.identity.host_certificate(k, names, now=now, validity=self.validity)) for k in self.keys
        ]
        if self.acceptor is not None:
            self.acceptor.update(server_host_keys=pairs)
        self.pairs, self._names, self.signed = pairs, names, now
        self.valid_after, self.valid_before = int(now) - CERT_BACKDATE, int(now) + self.validity

    def attach(self, acceptor: Any) -> None:
        """Give renewed certificates to ``acceptor`` (what asyncssh.create_server returned)."""
        self.acceptor = acceptor

    def check(self) -> bool:
        """Renew the certificates if they are due (True when renewed); never raises."""
        now = self.now()
        if not due(now, self.valid_after, self.valid_before, self.validity):
            return False
        try:
            self._sign()
        except Exception as exc:  # noqa: BLE001 - renewal is retried at the next look
            self.error = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
            if now - self._warned >= WARN_EVERY:
                self._warned = now
                log.error(
                    "cannot renew this member's host certificate: %s; it %s %s, and then other "
                    "members and users' @cert-authority lines no longer trust this host (retried "
                    "every %gs)",
                    self.error,
                    "expired" if self.valid_before <= now else "expires",
                    _when(self.valid_before),
                    self.interval,
                )
            return False
        if self.error:
            log.info("host certificate renewed after earlier failures (%s)", self.error)
        self.error = ""
        log.info("renewed this member's host certificate: valid until %s", _when(self.valid_before))
        return True

    async def run(self) -> None:
        """Look at the clock every ``interval`` seconds, renewing when due (a task)."""
        while True:
            await asyncio.sleep(self.interval)
            self.check()

    def status(self) -> dict[str, Any]:
        """For ``mtgpu-setup status``: the validity, and a warning when the
        certificate is near its end (renewal is overdue) or expired."""
        now = self.now()
        left = self.valid_before - now
        warning = ""
        if left <= 0:
            warning = "EXPIRED: members and users no longer trust this host"
        elif self.error or left < self.validity / 3 - 2 * self.interval:  # renewal overdue
            warning = f"expires {_when(self.valid_before)} and was not renewed"
        if warning and self.error:
            warning += f" ({self.error})"
        return {
            "valid_after": self.valid_after,
            "valid_before": self.valid_before,
            "signed": self.signed,
            "renew_after": self.valid_before - self.validity / 3,
            "principals": list(self._names),
            "error": self.error,
            "warning": warning,
        }


def register(dispatcher: Any, certs: HostCertificates) -> None:
    """Register ``ssh.host_certificate`` (admins only) on ``dispatcher``."""

    def host_certificate(caller: Any, args: dict[str, Any]) -> dict[str, Any]:
        """This member's host certificate: its validity, and whether renewal failed."""
        return certs.status()

    dispatcher.register("ssh.host_certificate", host_certificate, admin=True)
