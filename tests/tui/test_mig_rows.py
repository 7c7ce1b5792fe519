"""remotegpu-cli draws a card in MIG mode with its MIG devices under it, from the
member object a server sends (the simulated probe's MIG card, as `mt-job nodes --json`
gives it)."""

from __future__ import annotations

from mtgpu.config import load_text
from mtgpu.gpuinfo.simulated import SimulatedProbe
from mtgpu.gpuinfo.types import HostUsage, NodeInventory
from mtgpu.tui.fleet import UP, Fleet, ServerState
from mtgpu.tui.main import gpu_summary
from mtgpu.tui.screen import App
from mtgpu.tui.sources import ServerList, Target

CONFIG = (
    "SIMULATED_GPUS:\n  - {type: h100, vram: 80G}\n"
    "  - {type: h100, vram: 80G, mig: [3g.40gb, 2g.20gb, 1g.10gb]}\n"
)


def member() -> dict:
    gpus = SimulatedProbe(load_text(CONFIG).simulated_gpus, "gpu01").probe()
    inv = NodeInventory("gpu01", tuple(reversed(gpus)), HostUsage(16, 0.0, 1 << 36, 0, 0, 0))
    return inv.to_dict({13: ["17"]})


def test_mig_devices_are_drawn_under_their_card() -> None:
    st = ServerState(Target("gpu01", "gpu01"), status=UP, server="gpu01", nodes=[member()])
    rows = App(Fleet(ServerList(targets=()))).server_rows(st)
    text = [b"".join(r.render((100,)).text).decode().rstrip() for r in rows[1:]]
    shown = []
    for t in text:
        words = t.split()
        under = words[0] == "\u2514"
        words = words[1:] if under else words
        shown.append((under, words[0], words[1] + (" MIG" if words[2] == "MIG" else "")))
    assert shown == [
        (False, "GPU0", "h100"),
        (False, "GPU1", "h100 MIG"),
        (True, "GPU10", "h100-3g.40gb"),
        (True, "GPU13", "h100-2g.20gb"),
        (True, "GPU15", "h100-1g.10gb"),
    ], text
    assert "jobs 17" in text[3]


def test_the_server_summary_counts_mig_devices_not_their_card() -> None:
    assert (
        gpu_summary(member()) == "1x h100 80.0G, 1x h100-3g.40gb 40.0G, 1x h100-2g.20gb 20.0G, "
        "1x h100-1g.10gb 10.0G"
    )
