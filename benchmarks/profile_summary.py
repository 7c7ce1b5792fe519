"""The top costs in a py-spy profile of collapsed stacks (``py-spy record -f raw``,
as ``cluster_load.py --profile`` writes them): the share of the samples that
compute (threads waiting in a poll or for work are left out) by the frame each
sample was in (self), and by each frame on the stack (inclusive), per function
and per area (the package or library the function is in).

    python benchmarks/profile_summary.py benchmarks/profiles/scheduler-1000-steady.txt [--top 15]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

#: Leaves where a thread waits (for work, a socket, a lock) rather than computes: py-spy
#: reports some of these blocked threads as active. Counted apart, as "waiting".
WAITING = frozenset(
    {
        "_worker (concurrent/futures/thread.py)",
        "PollPoller.poll (pysyncobj/poller.py)",
        "EpollSelector.select (selectors.py)",
        "_PollLikeSelector.select (selectors.py)",
        "Thread._wait_for_tstate_lock (threading.py)",
        "Condition.wait (threading.py)",
        "Event.wait (threading.py)",
    }
)

FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def parse(path: Path) -> list[tuple[list[tuple[str, str]], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = []
        for f in stack.split(";"):
            m = FRAME.match(f)
            frames.append((m["fn"], m["file"]) if m else (f, "?"))
        stacks.append((frames, int(n)))
    return stacks


def area(file: str) -> str:
    """mtgpu/schedd/scheduler.py -> mtgpu.schedd; asyncssh/connection.py -> asyncssh."""
    parts = file.split("/")
    if parts[0] == "mtgpu" and len(parts) > 2:
        return "mtgpu." + parts[1]
    return parts[0].removesuffix(".py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    every = parse(args.profile)
    stacks = [(f, n) for f, n in every if f"{f[-1][0]} ({f[-1][1]})" not in WAITING]
    waiting = sum(n for _, n in every) - sum(n for _, n in stacks)
    total = sum(n for _, n in stacks) or 1
    self_fn: Counter[str] = Counter()
    self_area: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for frames, n in stacks:
        fn, file = frames[-1]
        self_fn[f"{fn} ({file})"] += n
        self_area[area(file)] += n
        for f in {f"{fn} ({file})" for fn, file in frames}:
            incl[f] += n
    print(f"# {args.profile}: {total} samples computing ({waiting} more waiting, left out)")
    ours = Counter({k: v for k, v in incl.items() if k.endswith(".py)") and "(mtgpu/" in k})
    for k in ("<module> (mtgpu/server.py)", "main (mtgpu/server.py)"):
        ours.pop(k, None)
    for title, counter in (
        ("self, by area", self_area),
        ("self, by function", self_fn),
        ("inclusive, MTGPU's functions", ours),
    ):
        print(f"\n{title}:")
        for name, n in counter.most_common(args.top):
            print(f"  {100 * n / total:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
