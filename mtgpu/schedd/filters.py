"""Feasibility filters: can this member take one member of this job, and with which GPUs?

The planner keeps the cluster in two parts so that copying it for a what-if is cheap:

- :class:`Layout` is what never changes during a pass (names, capacities, which GPU is
  where), built once from a :class:`~mtgpu.schedd.types.ClusterSnapshot` and shared by
  every copy;
- :class:`Usage` is what placing and releasing change (free CPUs, committed RAM and
  VRAM, GPU holders), kept in flat lists so a copy is a handful of list copies.

:func:`check_node` runs the filters in order, cheapest first, and names the first one
that turns the member away. The names are the keys of ``Reason.per_filter_counts``:

===============  ==========================================================
``server_pin``   the job is pinned to other servers
``gpu_model``    fewer GPUs of the asked brand/type than the job needs, at all
``node_state``   the member is down or drained
``member_held``  another job holds the whole member (sbatch's --exclusive)
``member_busy``  the job asks for whole members and this one runs other work
``cpus``         too few CPUs not committed
``ram``          too little RAM: total minus the larger of measured and committed
``gpu_count``    too few of them free for the mode (exclusive needs an untouched
                 GPU; shared and overcommit need one nobody holds whole)
``vram``         too few with the VRAM the mode needs (shared: total minus the larger
                 of measured and committed; overcommit: total minus measured;
                 exclusive with ``vram=``: total minus measured)
``reserved``     kept for the job at the head of the queue (see the queue)
===============  ==========================================================

Pin, model and drain state are static and cheap, and drained members are left out of
the planner's indexes entirely. CPU and RAM come before the GPU count and VRAM because
they are two comparisons where the GPU checks scan every GPU of the member; on a busy
cluster most members that the GPU index offers are turned away by them.
"""

from __future__ import annotations

from collections.abc import Sequence

from mtgpu.schedd.types import (
    ClusterSnapshot,
    GpuMode,
    MemberPlacement,
    NodeState,
    ResourceRequest,
)

FILTERS = (
    "server_pin",
    "gpu_model",
    "node_state",
    "member_held",
    "member_busy",
    "cpus",
    "ram",
    "gpu_count",
    "vram",
    "reserved",
)

_EXCLUSIVE = GpuMode.EXCLUSIVE
_SHARED = GpuMode.SHARED


class Layout:
    """The parts of a snapshot that placing does not change; shared by planner copies.

    GPUs get global ids ``0..G-1`` in member order, then index order, so sorting ids
    sorts by member and index.
    """

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        nodes = snapshot.nodes
        self.names: list[str] = [n.name for n in nodes]
        self.index_of: dict[str, int] = {n.name: i for i, n in enumerate(nodes)}
        self.cpus: list[int] = [n.cpus for n in nodes]
        self.ram_total: list[int] = [n.ram_total for n in nodes]
        self.up: list[bool] = [n.state is NodeState.UP for n in nodes]
        self.states: list[NodeState] = [n.state for n in nodes]
        self.features: list[frozenset[str]] = [frozenset(n.features) for n in nodes]
        self.node_gpus: list[tuple[int, ...]] = []
        self.gpu_node: list[int] = []
        self.gpu_index: list[int] = []
        self.gpu_brand: list[str] = []
        self.gpu_type: list[str] = []
        self.gpu_total: list[int] = []
        self.gpu_by_index: list[dict[int, int]] = []
        for i, n in enumerate(nodes):
            ids = []
            by_index = {}
            for g in sorted(n.gpus, key=lambda g: g.index):
                gid = len(self.gpu_node)
                ids.append(gid)
                by_index[g.index] = gid
                self.gpu_node.append(i)
                self.gpu_index.append(g.index)
                self.gpu_brand.append(g.brand)
                self.gpu_type.append(g.type)
                self.gpu_total.append(g.vram_total)
            self.node_gpus.append(tuple(ids))
            self.gpu_by_index.append(by_index)
        self.all_up = all(self.up)
        self.max_cpus = max(self.cpus, default=0)
        self.max_gpus = max((len(g) for g in self.node_gpus), default=0)
        self.name_bytes: list[bytes] = [n.encode() for n in self.names]
        # GPU classes (brand, type): an index matches a class or not, never half of one.
        self.classes: list[tuple[str, str]] = sorted(set(zip(self.gpu_brand, self.gpu_type)))
        class_id = {c: k for k, c in enumerate(self.classes)}
        self.gpu_class: list[int] = [class_id[c] for c in zip(self.gpu_brand, self.gpu_type)]
        # Hardware profiles: members alike in CPUs, RAM and GPUs, counted once each, so
        # the "could it ever run" check costs the number of kinds of host, not of hosts.
        profiles: dict[tuple[int, int, tuple[tuple[str, str, int, int], ...]], list[int]] = {}
        for i in range(len(self.names)):
            kinds: dict[tuple[str, str, int], int] = {}
            for gid in self.node_gpus[i]:
                kind = (self.gpu_brand[gid], self.gpu_type[gid], self.gpu_total[gid])
                kinds[kind] = kinds.get(kind, 0) + 1
            gpus = tuple(sorted(k + (n,) for k, n in kinds.items()))
            counts = profiles.setdefault((self.cpus[i], self.ram_total[i], gpus), [0, 0])
            counts[0] += 1
            counts[1] += self.up[i]
        #: (members, members up, CPUs, RAM, GPUs as (brand, type, VRAM, how many)) per profile.
        self.profiles: list[tuple[int, int, int, int, tuple[tuple[str, str, int, int], ...]]] = [
            (all_, up, cpus, ram, gpus) for (cpus, ram, gpus), (all_, up) in profiles.items()
        ]
        self._match: dict[tuple[str | None, str | None], list[tuple[int, ...]]] = {}
        self._profiles_for: dict[
            tuple[str | None, str | None], list[tuple[int, int, int, int, tuple[int, ...]]]
        ] = {}

    def __len__(self) -> int:
        return len(self.names)

    def profiles_for(
        self, brand: str | None, type_: str | None
    ) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
        """Per host profile: (members, members up, CPUs, RAM, VRAM of matching GPUs largest first). Cached."""
        key = (brand, type_)
        got = self._profiles_for.get(key)
        if got is None:
            got = [
                (
                    all_,
                    up,
                    cpus,
                    ram,
                    tuple(
                        sorted(
                            (
                                t
                                for b, ty, t, n in gpus
                                if (brand is None or b == brand) and (type_ is None or ty == type_)
                                for _ in range(n)
                            ),
                            reverse=True,
                        )
                    ),
                )
                for all_, up, cpus, ram, gpus in self.profiles
            ]
            self._profiles_for[key] = got
        return got

    def class_matches(self, brand: str | None, type_: str | None) -> list[bool]:
        """For each GPU class, whether it satisfies this brand/type constraint."""
        return [(brand is None or b == brand) and (type_ is None or t == type_) for b, t in self.classes]

    def matching(self, brand: str | None, type_: str | None) -> list[tuple[int, ...]]:
        """Per member, the global ids of GPUs of this brand/type (None matches any). Cached."""
        key = (brand, type_)
        got = self._match.get(key)
        if got is None:
            got = [
                tuple(
                    g
                    for g in ids
                    if (brand is None or self.gpu_brand[g] == brand)
                    and (type_ is None or self.gpu_type[g] == type_)
                )
                for ids in self.node_gpus
            ]
            self._match[key] = got
        return got


class Usage:
    """What placements change, in flat lists indexed by member or global GPU id.

    ``ram_used`` and ``gpu_used`` start as measured use; placing adds the declared
    amounts to them too, as an estimate until the next measurement shows the truth.
    """

    __slots__ = (
        "cpus_free",
        "gpu_committed",
        "gpu_holder",
        "gpu_shared",
        "gpu_used",
        "ram_committed",
        "ram_used",
        "whole",
    )

    def __init__(self, snapshot: ClusterSnapshot | None = None) -> None:
        if snapshot is None:
            return
        nodes = snapshot.nodes
        self.cpus_free = [n.cpus - n.cpus_committed for n in nodes]
        self.ram_used = [n.ram_used for n in nodes]
        self.ram_committed = [n.ram_committed for n in nodes]
        gpus = [g for n in nodes for g in sorted(n.gpus, key=lambda g: g.index)]
        self.gpu_used = [g.vram_used for g in gpus]
        self.gpu_committed = [g.vram_committed for g in gpus]
        self.gpu_holder: list[str | None] = [g.exclusive_job for g in gpus]
        self.gpu_shared = [g.shared_jobs for g in gpus]
        self.whole: list[str | None] = [n.whole_job for n in nodes]

    def copy(self) -> Usage:
        """An independent copy (list copies only)."""
        u = Usage()
        u.cpus_free = self.cpus_free.copy()
        u.ram_used = self.ram_used.copy()
        u.ram_committed = self.ram_committed.copy()
        u.gpu_used = self.gpu_used.copy()
        u.gpu_committed = self.gpu_committed.copy()
        u.gpu_holder = self.gpu_holder.copy()
        u.gpu_shared = self.gpu_shared.copy()
        u.whole = self.whole.copy()
        return u

    def idle(self, layout: Layout, i: int) -> bool:
        """True if member ``i`` runs nothing placed: no CPU, RAM or GPU committed."""
        return (
            self.whole[i] is None
            and self.cpus_free[i] >= layout.cpus[i]
            and not self.ram_committed[i]
            and all(self.gpu_holder[g] is None and not self.gpu_shared[g] for g in layout.node_gpus[i])
        )

    def ram_free(self, layout: Layout, i: int) -> int:
        """RAM left on member ``i``: total minus the larger of measured and committed."""
        return layout.ram_total[i] - max(self.ram_used[i], self.ram_committed[i])

    def gpu_free(self, layout: Layout, g: int, mode: GpuMode) -> int:
        """VRAM on GPU ``g`` that a job in ``mode`` may count on."""
        if mode is _SHARED:
            return layout.gpu_total[g] - max(self.gpu_used[g], self.gpu_committed[g])
        return layout.gpu_total[g] - self.gpu_used[g]


def check_node(
    layout: Layout, use: Usage, i: int, req: ResourceRequest, match: Sequence[tuple[int, ...]]
) -> tuple[str | None, tuple[int, ...]]:
    """Run the filters for member ``i``: (first filter that fails or None, chosen GPU ids).

    ``match`` is ``layout.matching(req.gpu_brand, req.gpu_type)``. The chosen GPUs are
    the best fit on the member: for shared and overcommit the GPUs with the least
    VRAM that still fits, for exclusive the ones with the least measured use.
    """
    k = req.gpus
    if k and len(match[i]) < k:
        return "gpu_model", ()
    if not layout.up[i]:
        return "node_state", ()
    if use.whole[i] is not None:
        return "member_held", ()
    if req.whole_member and not use.idle(layout, i):
        return "member_busy", ()
    # CPU and RAM are two comparisons; the GPU checks below scan the member's GPUs.
    if use.cpus_free[i] < req.cpus:
        return "cpus", ()
    if layout.ram_total[i] - max(use.ram_used[i], use.ram_committed[i]) < req.ram:
        return "ram", ()
    if not k:
        return None, ()
    mode = req.gpu_mode
    holder = use.gpu_holder
    if mode is _EXCLUSIVE:
        shared = use.gpu_shared
        free = [g for g in match[i] if holder[g] is None and not shared[g]]
    else:
        free = [g for g in match[i] if holder[g] is None]
    if len(free) < k:
        return "gpu_count", ()
    v = req.vram
    total = layout.gpu_total
    used = use.gpu_used
    if mode is _EXCLUSIVE:
        fit = [(used[g], g) for g in free if not v or total[g] - used[g] >= v]
    elif mode is _SHARED:
        committed = use.gpu_committed
        fit = [(left, g) for g in free if (left := total[g] - max(used[g], committed[g])) >= v]
    else:
        fit = [(left, g) for g in free if (left := total[g] - used[g]) >= v]
    if len(fit) < k:
        return "vram", ()
    fit.sort()
    return None, tuple(g for _, g in fit[:k])


def member_fits(
    layout: Layout, use: Usage, member: MemberPlacement, mode: GpuMode, whole: bool = False
) -> bool:
    """True if this exact member placement (node, GPU indices) fits ``use`` as it stands;
    ``whole``: it takes the whole member, which must then run nothing else."""
    i = layout.index_of.get(member.node)
    if i is None or not layout.up[i] or use.whole[i] is not None:
        return False
    if whole and not use.idle(layout, i):
        return False
    if use.cpus_free[i] < member.cpus or use.ram_free(layout, i) < member.ram:
        return False
    for index in member.gpu_indices:
        g = layout.gpu_by_index[i].get(index)
        if g is None or use.gpu_holder[g] is not None:
            return False
        if mode is _EXCLUSIVE:
            if use.gpu_shared[g] or (
                member.vram_per_gpu and use.gpu_free(layout, g, mode) < member.vram_per_gpu
            ):
                return False
        elif use.gpu_free(layout, g, mode) < member.vram_per_gpu:
            return False
    return True


def apply_member(
    layout: Layout,
    use: Usage,
    member: MemberPlacement,
    mode: GpuMode,
    job_id: str,
    sign: int,
    *,
    estimate: bool = True,
    whole: bool = False,
) -> int:
    """Commit (``sign=1``) or release (``sign=-1``) one member; returns the member's index.

    With ``estimate`` the declared RAM and VRAM are also added to (or taken from) the
    measured use, standing in for what the next measurement will show. Releasing an
    exclusive GPU then sets its measured use to zero: the job's own use goes with it.
    ``whole``: the job holds the member whole (sbatch's --exclusive).
    """
    i = layout.index_of[member.node]
    if whole:
        use.whole[i] = job_id if sign > 0 else None
    use.cpus_free[i] -= sign * member.cpus
    use.ram_committed[i] += sign * member.ram
    if estimate:
        use.ram_used[i] = max(0, use.ram_used[i] + sign * member.ram)
    v = member.vram_per_gpu
    for index in member.gpu_indices:
        g = layout.gpu_by_index[i].get(index)
        if g is None:
            # Gone from the member's report since it was placed (a MIG instance an
            # administrator destroyed): nothing is left there to hold or release.
            continue
        if mode is _EXCLUSIVE:
            use.gpu_holder[g] = job_id if sign > 0 else None
            if sign < 0 and estimate:
                use.gpu_used[g] = 0
            continue
        use.gpu_shared[g] = max(0, use.gpu_shared[g] + sign)
        if estimate:
            use.gpu_used[g] = max(0, use.gpu_used[g] + sign * v)
        if mode is _SHARED:
            use.gpu_committed[g] = max(0, use.gpu_committed[g] + sign * v)
    return i
