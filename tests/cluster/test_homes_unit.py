"""The homes layout from markers in real directories: shared, independent, mixed."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from mtgpu.cluster.homes import HomesProbe, layout, marker_path, workdir_help
from mtgpu.cluster.members import Members


async def apply(method, *args, **kw):
    """The replicated call of a cluster of one: applied at once."""
    return method(*args, _doApply=True)


def members(*names: str) -> Members:
    m = Members()
    for n in names:
        m.upsert(n, f"{n}:2222", 1.0, "voter", 0.0, _doApply=True)
    return m


def settle(probes: list[HomesProbe]) -> None:
    async def go() -> None:
        for _ in range(3):  # tokens first, then what each sees of the others'
            for p in probes:
                await p.check()

    asyncio.run(go())


def test_independent_mixed_and_shared(tmp_path: Path) -> None:
    m = members("a", "b", "c")
    roots = {n: str(tmp_path / n) for n in "abc"}
    probes = [HomesProbe(roots[n], n, m, apply) for n in "abc"]
    assert layout(m)["homes"] == "unknown"  # nobody has looked yet
    settle(probes)
    lay = layout(m)
    assert lay == {"homes": "independent", "shares": {"a": [], "b": [], "c": []}}
    assert (os.stat(marker_path(roots["a"], "a")).st_mode & 0o777) == 0o644

    # b and c now use one directory (the same storage): mixed.
    probes[2].root = roots["b"]
    probes[2]._written = False
    settle(probes)
    lay = layout(m)
    assert lay["homes"] == "mixed" and lay["shares"] == {"a": [], "b": ["c"], "c": ["b"]}

    for p in probes:
        p.root, p._written = roots["a"], False
    settle(probes)
    assert layout(m) == {"homes": "shared", "shares": {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}}
    assert workdir_help(m, "b", roots["a"], roots["a"] + "/ann/run") == ""
    assert workdir_help(m, "b", roots["a"], "/scratch/run").startswith(
        f"/scratch/run is outside TENANT_HOME_ROOT ({roots['a']}), on b's own disk: copy"
    )


def test_a_copied_marker_does_not_count(tmp_path: Path) -> None:
    m = members("a", "b")
    pa, pb = HomesProbe(str(tmp_path / "a"), "a", m, apply), HomesProbe(str(tmp_path / "b"), "b", m, apply)
    settle([pa, pb])
    # Someone copies /home from a to b, markers included: b's copy holds a's token
    # until a restarts with a new one.
    shutil.copy(marker_path(pa.root, "a"), marker_path(pb.root, "a"))
    settle([pa, pb])
    assert m.homes["b"]["shares"] == ["a"]  # b sees a's current marker...
    assert layout(m)["homes"] == "independent"  # ...but a does not see b's
    pa.token, pa._written = "a-restarted", False
    settle([pa, pb])
    assert m.homes["b"]["shares"] == [] and layout(m)["homes"] == "independent"


def test_workdir_help_names_the_member_and_what_to_do(tmp_path: Path) -> None:
    m = members("a", "b", "c")
    probes = [HomesProbe(str(tmp_path / n), n, m, apply) for n in "abc"]
    settle(probes)
    text = workdir_help(m, "b", str(tmp_path / "b"), str(tmp_path / "b" / "ann" / "run"))
    assert text.startswith("b does not share TENANT_HOME_ROOT with a, c: copy the directory to b")
    assert "server=" in text and "shares" in text
    outside = workdir_help(m, "b", str(tmp_path / "b"), "/scratch/run")
    assert outside.startswith("b does not share TENANT_HOME_ROOT with a, c: copy")
    assert workdir_help(members("solo"), "solo", "/home", "/home/x") == ""


def test_removed_member_drops_out_of_the_layout(tmp_path: Path) -> None:
    m = members("a", "b")
    probes = [HomesProbe(str(tmp_path), n, m, apply) for n in "ab"]
    settle(probes)
    assert layout(m)["homes"] == "shared"
    m.remove("b", 1.0, _doApply=True)
    settle(probes[:1])
    assert layout(m) == {"homes": "shared", "shares": {"a": []}}
    assert "b" not in m.homes


def test_layout_and_workdir_help_agree_with_the_pairwise_rule_on_many_members() -> None:
    """Two members share homes when each lists the other; checked against every pair."""
    import random

    rng = random.Random(7)
    names = [f"n{i:03d}" for i in range(120)]
    m = members(*names)
    groups = [names[i : i + 30] for i in range(0, 120, 30)]
    for g in groups:
        for n in g:
            seen = [o for o in g if o != n and rng.random() < 0.9]
            seen += rng.sample(names, 2) + ["gone"]  # one-sided claims, a removed member
            m.set_homes(n, "t" + n, seen, 0.0, _doApply=True)
    lay = layout(m)
    for a in names:
        want = [b for b in names if b != a and b in m.homes[a]["shares"] and a in m.homes[b]["shares"]]
        assert lay["shares"][a] == want
    assert lay["homes"] == "mixed"
    alone = next(a for a in names if len(lay["shares"][a]) < 119)
    assert "does not share TENANT_HOME_ROOT with" in workdir_help(m, alone, "/home", "/home/x/w")
