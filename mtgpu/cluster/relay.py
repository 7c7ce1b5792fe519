"""A member's relay of a tenant's request to the scheduler, through a failover.

A member that is not the scheduler sends a tenant's job operation to the member its
replica names as the Raft leader (``forward``). When that leader dies, the replica
goes on naming it until a new one is elected (1-2 s), and a dial to a machine that is
gone (no reset comes back) waits out ``CLUSTER_CONNECT_TIMEOUT``. :func:`relay`
therefore watches the replica's view while it dials and waits: once another leader is
named, it gives up on the old one at once and sends to the new one, rather than let
the tenant's request wait for a dead machine and then fail.

What is sent again is only what cannot be done twice: a request never written to
the old leader (its dial had not finished or failed), a read, or a submission
carrying its key (``token``: the scheduler answers a repeated key with the first
outcome). Any other request whose answer was lost is refused ``unreachable`` as
before, and the client decides.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mtgpu.cluster.peers import PeerClient
from mtgpu.errors import ApiError

#: How long a relayed request waits for a scheduler to be elected, or for another one
#: after the one it was sent to went away (seconds), before it is refused ``no_leader``
#: (retryable: clients send it again).
FAILOVER_WAIT = 20.0
#: How often the replica's view of the leader is looked at while a relay waits.
LEADER_POLL = 0.05
#: After a leader that is still named did not answer: the pause before it is tried again.
SAME_LEADER_PAUSE = 0.5
#: How long a relayed request may wait for the scheduler's answer once sent.
ANSWER_TIMEOUT = 30.0

log = logging.getLogger("mtgpu.cluster")

NO_LEADER = "no scheduler is elected right now; retry in a few seconds"


def resendable(op: str, args: dict[str, Any]) -> bool:
    """Whether ``op`` may be sent again when its answer was lost: a read, or a
    submission with its key.

    >>> resendable("job.list", {}), resendable("job.submit", {"token": "k"})
    (True, True)
    >>> resendable("job.submit", {}), resendable("job.cancel", {"job_id": "4"})
    (False, False)
    """
    if op in ("job.list", "job.show", "nodes"):
        return True
    return op == "job.submit" and bool(args.get("token"))


async def _unless_moved(fut: asyncio.Future[Any], leader_of: Callable[[], str | None], leader: str) -> bool:
    """Wait for ``fut``; True (``fut`` cancelled) if the view stops naming ``leader`` first."""
    while True:
        done, _ = await asyncio.wait({fut}, timeout=LEADER_POLL)
        if done:
            return False
        if leader_of() != leader:
            fut.cancel()
            fut.add_done_callback(_retrieve)
            return True


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Take a given-up request's outcome, so that its failure is not logged as unseen."""
    if not fut.cancelled():
        fut.exception()


async def _next(leader_of: Callable[[], str | None], gone: str | None, deadline: float) -> str:
    """The leader to send to: one other than ``gone`` (a leader that failed), or
    ``gone`` again once it is elected anew or after :data:`SAME_LEADER_PAUSE`."""
    loop = asyncio.get_running_loop()
    same_after = loop.time() + SAME_LEADER_PAUSE
    seen_none = False
    while True:
        now = leader_of()
        if now is None:
            seen_none = True
        elif now != gone or seen_none or loop.time() >= same_after:
            return now
        if loop.time() >= deadline:
            raise ApiError(NO_LEADER, "no_leader")
        await asyncio.sleep(LEADER_POLL)


async def relay(
    peers: PeerClient,
    leader_of: Callable[[], str | None],
    op: str,
    args: dict[str, Any],
    caller: dict[str, Any],
    *,
    wait: float = FAILOVER_WAIT,
) -> Any:
    """``forward`` ``op`` to the leader ``leader_of`` names, following it through a
    failover (see the module's text); the scheduler's answer, or its ApiError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    again = resendable(op, args)
    gone: str | None = None
    last: ApiError | None = None  # the last leader's refusal to connect or answer
    while True:
        try:
            leader = await _next(leader_of, gone, deadline)
        except ApiError:
            if last is not None and leader_of() == gone:
                raise last from None
            raise
        gone = leader
        # The dial: nothing is sent yet, so a new leader is tried at once.
        dial: asyncio.Future[Any] = asyncio.ensure_future(peers.connection(leader))
        if await _unless_moved(dial, leader_of, leader):
            log.info("relaying %s: %s is no longer the scheduler; sent to the new one", op, leader)
            continue
        try:
            dial.result()
        except ApiError as exc:
            if exc.code != "unreachable" or loop.time() >= deadline:
                raise
            last = exc
            log.info("relaying %s: %s; sent again once a scheduler answers", op, exc)
            continue
        call: Awaitable[Any] = peers.call(
            leader, "forward", op=op, args=args, caller=caller, timeout=ANSWER_TIMEOUT
        )
        if not again:
            return await call
        sent: asyncio.Future[Any] = asyncio.ensure_future(call)
        if await _unless_moved(sent, leader_of, leader):
            log.info("relaying %s: %s is no longer the scheduler; sent again to the new one", op, leader)
            continue
        try:
            return sent.result()
        except ApiError as exc:
            if exc.code != "unreachable" or loop.time() >= deadline:
                raise
            last = exc
            log.info("relaying %s: %s; sent again once a scheduler answers", op, exc)
