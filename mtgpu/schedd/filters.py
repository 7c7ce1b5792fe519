"""Feasibility filters: can this member take one member of this job, and with which GPUs?

The planner keeps the cluster in two parts so that copying it for a what-if is cheap:

- :class:`Layout` is what never changes during a pass (names, capacities, which GPU is
  where), built once from a :class:`~mtgpu.schedd.types.ClusterSnapshot` and shared by
  every copy;
- :class:`Usage` is what placing and releasing change (free CPUs, committed RAM and
  VRAM, GPU holders), kept in flat lists so a copy is a handful of list copies.

Each placement rule is one :class:`Filter` (as in Nomad's scheduler stack), defined
once and used for three questions: does a member fit now (free capacity), could it ever
(the same rule against total capacity, :meth:`Layout.empty`), and what the pending
reason says about the members it turns away. :data:`FILTERS` is the registry, in the
order a decision runs them; the first that turns a member away is counted under its
name in ``Reason.per_filter_counts``:

===============  ==========================================================
``server_pin``   the job is pinned to other servers
``excluded``     the job names the member in --exclude
``constraint``   the member lacks the features the job's --constraint asks for
``reserved``     kept for the job at the head of the queue (see the queue)
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
===============  ==========================================================

Pin, --exclude, --constraint, model and drain state are static and cheap, and drained
members are left out of the planner's indexes entirely. A member the job's own
--exclude or --constraint leaves out is counted there, never as ``reserved``: that word
is for another job's reservation only. CPU and RAM come before the GPU count and VRAM
because they are two comparisons where the GPU checks scan every GPU of the member; on
a busy cluster most members that the GPU index offers are turned away by them. Filters
run on a batch of members at a time (a list comprehension each), which is what keeps a
refusal's scan of the whole cluster cheap.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar

from mtgpu.config.units import format_size
from mtgpu.schedd.features import satisfies
from mtgpu.schedd.types import (
    ClusterSnapshot,
    GpuMode,
    MemberPlacement,
    NodeSnapshot,
    NodeState,
    ResourceRequest,
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
            counts = profiles.setdefault((self.cpus[i], self.ram_total[i], gpus), [i, 0, 0])
            counts[1] += 1
            counts[2] += self.up[i]
        #: (one member of the profile, members, members up) per hardware profile.
        self.profiles: list[tuple[int, int, int]] = [(i, all_, up) for i, all_, up in profiles.values()]
        self._match: dict[tuple[str | None, str | None], list[tuple[int, ...]]] = {}
        self._satisfying: dict[str, list[bool]] = {}
        self._empty: Usage | None = None

    def __len__(self) -> int:
        return len(self.names)

    @property
    def empty(self) -> Usage:
        """Use on an empty cluster (nothing measured or committed): what the filters read
        to answer "could it ever run". Built once; never written."""
        if self._empty is None:
            u = Usage()
            g = len(self.gpu_total)
            u.cpus_free = self.cpus.copy()
            u.ram_used, u.ram_committed = [0] * len(self), [0] * len(self)
            u.gpu_used, u.gpu_committed, u.gpu_shared = [0] * g, [0] * g, [0] * g
            u.gpu_holder = [None] * g
            u.whole = [None] * len(self)
            self._empty = u
        return self._empty

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

    def satisfying(self, constraint: str) -> list[bool]:
        """Per member, whether its features meet ``constraint`` (sbatch's --constraint). Cached."""
        got = self._satisfying.get(constraint)
        if got is None:
            got = self._satisfying[constraint] = [satisfies(f, constraint) for f in self.features]
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

    def refresh(self, i: int, node: NodeSnapshot, gids: Sequence[int]) -> None:
        """Set member ``i``'s entries from ``node`` as :meth:`__init__` would (``gids``:
        its GPUs' global ids, ``layout.node_gpus[i]``, of the same hardware)."""
        self.cpus_free[i] = node.cpus - node.cpus_committed
        self.ram_used[i] = node.ram_used
        self.ram_committed[i] = node.ram_committed
        self.whole[i] = node.whole_job
        for g, gpu in zip(gids, sorted(node.gpus, key=lambda g: g.index), strict=True):
            self.gpu_used[g] = gpu.vram_used
            self.gpu_committed[g] = gpu.vram_committed
            self.gpu_holder[g] = gpu.exclusive_job
            self.gpu_shared[g] = gpu.shared_jobs

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
            and len(idle_gpus(self, layout.node_gpus[i])) == len(layout.node_gpus[i])
        )

    def ram_free(self, layout: Layout, i: int) -> int:
        """RAM left on member ``i``: total minus the larger of measured and committed."""
        return layout.ram_total[i] - max(self.ram_used[i], self.ram_committed[i])

    def gpu_free(self, layout: Layout, g: int, mode: GpuMode) -> int:
        """VRAM on GPU ``g`` that a job in ``mode`` may count on."""
        if mode is _SHARED:
            return layout.gpu_total[g] - max(self.gpu_used[g], self.gpu_committed[g])
        return layout.gpu_total[g] - self.gpu_used[g]


def idle_gpus(use: Usage, ids: Sequence[int]) -> list[int]:
    """The GPUs of ``ids`` (global ids, order kept) that nobody uses: no job holds one
    whole and no shared or overcommit job runs on it. What an exclusive request needs,
    what a whole member (--exclusive) must have, and what the indexes and rankers count
    as idle: the one place this rule is written."""
    holder, shared = use.gpu_holder, use.gpu_shared
    return [g for g in ids if holder[g] is None and not shared[g]]


class Check:
    """One request against one state of the cluster: everything a filter reads.

    ``use`` is free capacity for "does it fit now", or :meth:`Layout.empty` for "could
    it ever fit" (the same rules, against total capacity). ``match`` is, per member, the
    GPU ids the request may use (``layout.matching`` of its brand/type, or the exact
    GPUs of a placement being checked). ``excluded`` are members kept out of this
    decision for another job (a reservation); ``dropped`` those the request's own
    ``--exclude`` names.
    """

    __slots__ = ("dropped", "excluded", "fits", "free", "layout", "match", "pinned", "req", "use")

    def __init__(
        self,
        layout: Layout,
        use: Usage,
        req: ResourceRequest,
        match: Sequence[tuple[int, ...]] | Mapping[int, tuple[int, ...]] | None = None,
        excluded: Collection[int] = frozenset(),
    ) -> None:
        self.layout, self.use, self.req = layout, use, req
        if match is None:
            match = layout.matching(req.gpu_brand, req.gpu_type) if req.gpus else layout.node_gpus
        self.match = match
        self.excluded = excluded
        self.pinned = frozenset(req.servers)
        index_of = layout.index_of
        self.dropped = frozenset(index_of[n] for n in req.exclude if n in index_of)
        # What the GPU filters found per member, for the filter after them and for
        # choosing the GPUs (a check is for one decision: the use does not change).
        self.free: dict[int, list[int]] = {}
        self.fits: dict[int, list[tuple[int, int]]] = {}


class Filter:
    """One placement rule, defined once and used three ways:

    - :meth:`keep` on a :class:`Check` of free capacity: who can take a member now;
    - :meth:`ever` on a :class:`Check` of :meth:`Layout.empty` (total capacity): who
      could ever take one (for most rules the same code, see :meth:`ever`);
    - :attr:`text` and :meth:`never`: what a pending reason says about those it turns
      away now, and when nobody could ever pass it.
    """

    #: The key in ``Reason.per_filter_counts``.
    name: ClassVar[str]
    #: The pending reason's words for members it turns away now: "``<count> <text>``";
    #: ``{label}`` is the GPU kind asked for.
    text: ClassVar[str]
    #: Its place in the "could it ever run" stages: GPU rules first, so the CPU and RAM
    #: messages can speak of members "that fit the rest".
    ever_order: ClassVar[int]

    def applies(self, c: Check) -> bool:
        """Whether the rule can turn any member away for this request: a decision skips
        the others (a shortcut only, :meth:`keep` is right either way)."""
        return True

    def keep(self, c: Check, members: list[int]) -> list[int]:
        """The ``members`` (member indices, order kept) that pass now."""
        raise NotImplementedError

    def ever(self, c: Check, members: list[int]) -> list[int]:
        """The ``members`` that could pass on an empty cluster; ``c.use`` is ``Layout.empty``."""
        return self.keep(c, members)

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        """Why nobody could ever pass: ``pool`` is every member considered, ``reached``
        those that passed the rules before this one."""
        return f"no member could ever pass the {self.name} filter"

    def too_few(self, c: Check, passed: int) -> str | None:
        """Why the job can never run when only ``passed`` members could ever pass this
        rule and it needs more; None for the general words."""
        return None


class ServerPin(Filter):
    name, text, ever_order = "server_pin", "are not among the pinned servers", 0

    def applies(self, c: Check) -> bool:
        return bool(c.req.servers)

    def keep(self, c: Check, members: list[int]) -> list[int]:
        names, pinned = c.layout.names, c.pinned
        return [i for i in members if names[i] in pinned] if pinned else members

    def pinned(self, layout: Layout, req: ResourceRequest) -> list[int]:
        """The members ``req`` is pinned to, in the order it names them (the names
        that are members; a pinned request's candidates)."""
        index_of = layout.index_of
        return [index_of[s] for s in req.servers if s in index_of]

    def unknown(self, layout: Layout, req: ResourceRequest) -> str | None:
        """Why the job can never run when it names servers that are not members and
        too few of those it names are; else None."""
        unknown = [s for s in req.servers if s not in layout.index_of]
        if not unknown or len(req.servers) - len(unknown) >= req.nodes:
            return None
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        return (
            f"server {shown} is not a member of this cluster; "
            f"expected one of {', '.join(layout.names[:10])}{' ...' if len(layout) > 10 else ''}"
        )


def _too_few(what: str, passed: int, need: int) -> str:
    return f"{what}: only {passed} member(s) of this cluster qualify, and it needs {need}"


class Excluded(Filter):
    """sbatch's --exclude: members the job itself names, never to use."""

    name, text, ever_order = "excluded", "are excluded by --exclude", 1

    def applies(self, c: Check) -> bool:
        return bool(c.dropped)

    def keep(self, c: Check, members: list[int]) -> list[int]:
        dropped = c.dropped
        return [i for i in members if i not in dropped] if dropped else members

    def too_few(self, c: Check, passed: int) -> str:
        return _too_few("--exclude", passed, c.req.nodes)

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        return self.too_few(c, 0)


class Constraint(Filter):
    """sbatch's --constraint: only members whose NODE_FEATURES meet it."""

    name, text, ever_order = "constraint", "lack the features asked by --constraint", 2

    def applies(self, c: Check) -> bool:
        return bool(c.req.constraint)

    def keep(self, c: Check, members: list[int]) -> list[int]:
        if not c.req.constraint:
            return members
        ok = c.layout.satisfying(c.req.constraint)
        return [i for i in members if ok[i]]

    def too_few(self, c: Check, passed: int) -> str:
        return _too_few(f"--constraint={c.req.constraint}", passed, c.req.nodes)

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        names = sorted({f for i in reached for f in c.layout.features[i]})
        have = (
            f"features of the members it may use: {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
            if names
            else "none of the members it may use lists a feature"
        )
        return f"{self.too_few(c, 0)} ({have})"


class Reserved(Filter):
    name, text, ever_order = "reserved", "are reserved for a higher-priority job", 3

    def applies(self, c: Check) -> bool:
        return bool(c.excluded)

    def keep(self, c: Check, members: list[int]) -> list[int]:
        excluded = c.excluded
        return [i for i in members if i not in excluded]


class GpuModel(Filter):
    name, text, ever_order = "gpu_model", "have too few {label} GPUs", 4

    def applies(self, c: Check) -> bool:
        return c.req.gpus > 0

    def keep(self, c: Check, members: list[int]) -> list[int]:
        match, k = c.match, c.req.gpus
        return [i for i in members if len(match[i]) >= k]

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        label = _label(c.req)
        most = max((len(c.match[i]) for i in pool), default=0)
        if most:
            return f"no member has {c.req.gpus} {label}GPUs; the most on one member is {most}"
        kinds = sorted({f"{b}:{t}" for b, t in c.layout.classes})
        none_here = f" (there are {', '.join(kinds[:8])})" if kinds else " (no member has any GPU)"
        return f"no member has {label}GPUs{none_here}"


class Drained(Filter):
    name, text, ever_order = "node_state", "are down or drained", 7

    def applies(self, c: Check) -> bool:
        return not c.layout.all_up

    def keep(self, c: Check, members: list[int]) -> list[int]:
        up = c.layout.up
        return [i for i in members if up[i]]

    def ever(self, c: Check, members: list[int]) -> list[int]:
        # A member down or drained now may come back.
        return members


class MemberHeld(Filter):
    name, text, ever_order = "member_held", "are held whole by another job (--exclusive)", 8

    def keep(self, c: Check, members: list[int]) -> list[int]:
        whole = c.use.whole
        return [i for i in members if whole[i] is None]


class MemberBusy(Filter):
    name, text, ever_order = "member_busy", "run other jobs (it asks for whole members, --exclusive)", 9

    def applies(self, c: Check) -> bool:
        return c.req.whole_member

    def keep(self, c: Check, members: list[int]) -> list[int]:
        layout, use = c.layout, c.use
        return [i for i in members if use.idle(layout, i)] if c.req.whole_member else members


class Cpus(Filter):
    name, text, ever_order = "cpus", "lack free CPUs", 10

    def keep(self, c: Check, members: list[int]) -> list[int]:
        free, want = c.use.cpus_free, c.req.cpus
        return [i for i in members if free[i] >= want]

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        most = max((c.layout.cpus[i] for i in reached), default=0)
        return f"no member that fits the rest has {c.req.cpus} CPUs; the most is {most}"


class Ram(Filter):
    name, text, ever_order = "ram", "lack free RAM", 11

    def keep(self, c: Check, members: list[int]) -> list[int]:
        total, used, committed, want = c.layout.ram_total, c.use.ram_used, c.use.ram_committed, c.req.ram
        return [i for i in members if total[i] - max(used[i], committed[i]) >= want]

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        most = max((c.layout.ram_total[i] for i in reached), default=0)
        return (
            f"no member that fits the rest has {format_size(c.req.ram)} of RAM; "
            f"the most is {format_size(most)}"
        )


class GpuCount(Filter):
    """Free for the mode: exclusive needs an untouched GPU, shared and overcommit one
    nobody holds whole."""

    name, text, ever_order = "gpu_count", "have too few free {label} GPUs", 5

    def applies(self, c: Check) -> bool:
        return c.req.gpus > 0

    def free(self, c: Check, i: int) -> list[int]:
        """Member ``i``'s matching GPUs that are free for the request's mode."""
        got = c.free.get(i)
        if got is None:
            if c.req.gpu_mode is _EXCLUSIVE:
                got = idle_gpus(c.use, c.match[i])
            else:
                holder = c.use.gpu_holder
                got = [g for g in c.match[i] if holder[g] is None]
            c.free[i] = got
        return got

    def keep(self, c: Check, members: list[int]) -> list[int]:
        # free() inlined: on a refusal this runs for every member of the cluster.
        k, match, use, holder, known = c.req.gpus, c.match, c.use, c.use.gpu_holder, c.free
        out = []
        if c.req.gpu_mode is _EXCLUSIVE:
            idle = idle_gpus
            for i in members:
                got = idle(use, match[i])
                if len(got) >= k:
                    known[i] = got
                    out.append(i)
        else:
            for i in members:
                got = [g for g in match[i] if holder[g] is None]
                if len(got) >= k:
                    known[i] = got
                    out.append(i)
        return out


class Vram(Filter):
    """Of the free GPUs, those with the VRAM the mode needs (shared: total minus the
    larger of measured and committed; overcommit, and exclusive with ``vram=``: total
    minus measured)."""

    name, text, ever_order = "vram", "lack free VRAM", 6

    def applies(self, c: Check) -> bool:
        return c.req.gpus > 0

    def keep(self, c: Check, members: list[int]) -> list[int]:
        k, v, mode = c.req.gpus, c.req.vram, c.req.gpu_mode
        total, used, committed = c.layout.gpu_total, c.use.gpu_used, c.use.gpu_committed
        known, fits, free = c.free, c.fits, GPU_COUNT.free
        out = []
        for i in members:
            ids = known.get(i)
            if ids is None:
                ids = free(c, i)
            # (best-fit key, GPU id): exclusive the least used first; shared and
            # overcommit the least VRAM left.
            if mode is _EXCLUSIVE:
                got = [(used[g], g) for g in ids if not v or total[g] - used[g] >= v]
            elif mode is _SHARED:
                got = [(left, g) for g in ids if (left := total[g] - max(used[g], committed[g])) >= v]
            else:
                got = [(left, g) for g in ids if (left := total[g] - used[g]) >= v]
            if len(got) >= k:
                fits[i] = got
                out.append(i)
        return out

    def choose(self, c: Check, i: int) -> tuple[int, ...]:
        """The GPUs member ``i`` gives (it passed): the best fit."""
        fit = c.fits.get(i)
        if fit is None:
            self.keep(c, [i])
            fit = c.fits[i]
        fit.sort()
        return tuple(g for _, g in fit[: c.req.gpus])

    def never(self, c: Check, pool: list[int], reached: list[int]) -> str:
        k, v, label = c.req.gpus, c.req.vram, _label(c.req)
        total = c.layout.gpu_total
        largest = max((total[g] for i in pool for g in c.match[i]), default=0)
        if k == 1 or largest < v:
            return f"no {label}GPU has {format_size(v)} of VRAM; the largest has {format_size(largest)}"
        return f"no member has {k} {label}GPUs with {format_size(v)} of VRAM each"


def _label(req: ResourceRequest) -> str:
    return "" if req.gpu_label() == "any" else req.gpu_label() + " "


SERVER_PIN, EXCLUDED, CONSTRAINT = ServerPin(), Excluded(), Constraint()
RESERVED, GPU_MODEL, NODE_STATE = Reserved(), GpuModel(), Drained()
MEMBER_HELD, MEMBER_BUSY, CPUS, RAM = MemberHeld(), MemberBusy(), Cpus(), Ram()
GPU_COUNT, VRAM = GpuCount(), Vram()

#: Every filter, in the order a decision runs them (cheapest first; the first that
#: turns a member away is the one counted). Pin, --exclude, --constraint, model and
#: drain state are static and cheap; CPU and RAM are two comparisons where the GPU rules
#: scan the member's GPUs. A member the job's own --exclude or --constraint leaves out
#: is counted there, not as reserved for another job.
FILTERS: tuple[Filter, ...] = (
    SERVER_PIN,
    EXCLUDED,
    CONSTRAINT,
    RESERVED,
    GPU_MODEL,
    NODE_STATE,
    MEMBER_HELD,
    MEMBER_BUSY,
    CPUS,
    RAM,
    GPU_COUNT,
    VRAM,
)
#: The same filters in the order of the "could it ever run" stages.
EVER_ORDER: tuple[Filter, ...] = tuple(sorted(FILTERS, key=lambda f: f.ever_order))
BY_NAME: dict[str, Filter] = {f.name: f for f in FILTERS}


def active(c: Check) -> list[Filter]:
    """The filters that can turn a member away for ``c``'s request, in decision order."""
    return [f for f in FILTERS if f.applies(c)]


def run(
    c: Check, members: list[int], filters: Sequence[Filter], counts: dict[str, int] | None = None
) -> list[int]:
    """The ``members`` that pass every filter of ``filters`` (order kept); each one
    turned away is counted in ``counts`` under the first filter that refused it."""
    for f in filters:
        if not members:
            break
        kept = f.keep(c, members)
        if counts is not None and len(kept) != len(members):
            counts[f.name] = counts.get(f.name, 0) + len(members) - len(kept)
        members = kept
    return members


def choose_gpus(c: Check, i: int) -> tuple[int, ...]:
    """The GPU ids member ``i`` (which passed the filters) gives the request."""
    return VRAM.choose(c, i) if c.req.gpus else ()


def check_node(
    layout: Layout, use: Usage, i: int, req: ResourceRequest, match: Sequence[tuple[int, ...]] | None = None
) -> tuple[str | None, tuple[int, ...]]:
    """The filters for one member: (first filter that fails or None, chosen GPU ids)."""
    c = Check(layout, use, req, match)
    counts: dict[str, int] = {}
    if not run(c, [i], active(c), counts):
        return next(iter(counts)), ()
    return None, choose_gpus(c, i)


def member_fits(
    layout: Layout, use: Usage, member: MemberPlacement, mode: GpuMode, whole: bool = False
) -> bool:
    """True if this exact member placement (node, GPU indices) fits ``use`` as it stands;
    ``whole``: it takes the whole member, which must then run nothing else.

    The filters run on a request made of the member's figures, with its own GPUs as
    the only ones it may use.
    """
    i = layout.index_of.get(member.node)
    if i is None:
        return False
    by_index = layout.gpu_by_index[i]
    if any(x not in by_index for x in member.gpu_indices):
        return False
    req = ResourceRequest(
        gpus=len(member.gpu_indices),
        gpu_mode=mode,
        vram=member.vram_per_gpu,
        cpus=member.cpus,
        # A whole member's RAM, all given to the job (--mem=0), is free when the member
        # is: measured use by the system never makes it not fit.
        ram=0 if whole and member.ram >= layout.ram_total[i] else member.ram,
        whole_member=whole,
    )
    c = Check(layout, use, req, {i: tuple(by_index[x] for x in member.gpu_indices)})
    return bool(run(c, [i], active(c)))


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
