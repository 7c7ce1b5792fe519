"""What remotegpu-cli's screen shows, in process: the key map, columns by terminal width,
wrapped reasons, usage bars and sparklines, elapsed and remaining times; and rows built
from hostile job fields stay printable."""

from __future__ import annotations

import re

import pytest

from mtgpu.tui.fleet import UP, Fleet, ServerState
from mtgpu.tui.screen import App, Row
from mtgpu.tui.sources import ServerList, Target
from mtgpu.tui.view import (
    KEYMAP,
    GpuHistory,
    action_for,
    bar_cells,
    duration,
    elapsed,
    footer_keys,
    gpu_layout,
    help_lines,
    job_cells,
    job_columns,
    job_details,
    left_text,
    month_usage,
    reason_width,
    remaining,
    sparkline,
    usage_refused,
    usage_text,
)

NOW = 1_800_000_000.0
LONG_REASON = (
    "Resources: needs 2 GPUs of type rtx4090 with 20G free each; gpu01 has 1 free until job 3 ends, "
    "expected within 48m"
)


def node() -> dict:
    gpus = [
        {"index": i, "type": "rtx4090", "vram_total": 24 << 30, "vram_used": u << 30, "util": p, "jobs": j}
        for i, u, p, j in ((0, 12, 45, ["3"]), (1, 0, 0, []))
    ]
    return {
        "name": "gpu01",
        "cpus": 32,
        "cpu_percent": 5,
        "ram_total": 64 << 30,
        "ram_used": 8 << 30,
        "gpus": gpus,
    }


def jobs() -> list[dict]:
    return [
        {
            "job_id": "3",
            "name": "train",
            "state": "RUNNING",
            "nodes": ["gpu01"],
            "gpus": [{"node": "gpu01", "index": 0}],
            "submit_time": NOW - 900,
            "start_time": NOW - 725,
            "time_limit": 3600,
            "cpus": 4,
            "ram": 8 << 30,
            "user": "lena",
        },
        {
            "job_id": "4",
            "name": "eval",
            "state": "PENDING",
            "position": 1,
            "reason": LONG_REASON,
            "submit_time": NOW - 60,
            "time_limit": None,
            "user": "lena",
        },
    ]


def app(width: int, job_list: list[dict] | None = None) -> App:
    st = ServerState(
        Target("gpu01", "gpu01"),
        status=UP,
        user="lena",
        server="gpu01",
        nodes=[node()],
        jobs=job_list or jobs(),
    )
    hist = GpuHistory()
    for u in (0, 10, 30, 60, 90, 100, 80, 45):
        hist.add({"util": u, "vram_total": 100, "vram_used": u})
    st.history[("gpu01", 0)] = hist
    f = Fleet(ServerList(targets=()))
    f.states["gpu01"] = st
    return App(f, width=width)


def lines(a: App, width: int) -> list[str]:
    return [line.decode().rstrip() for r in a.rows() for line in r.render((width,)).text]


# ------------------------------------------------------------------ keys


@pytest.mark.parametrize(
    ("key", "kind", "action"),
    [
        ("j", "server", "down"),
        ("k", "job", "up"),
        ("/", "workspace", "filter"),
        ("enter", "server", "details"),
        ("enter", "job", "details"),
        ("?", None, "help"),
        ("q", "job", "quit"),
        ("s", "server", "ssh"),
        ("s", "job", "ssh"),
        ("s", "workspace", "ssh"),
        ("b", "server", "submit"),
        ("S", "workspace", "start"),
        ("x", "workspace", "stop"),
        ("c", "job", "cancel"),
        ("l", "job", "log"),
        ("c", "server", None),
        ("S", "server", None),
    ],
)
def test_the_key_map(key: str, kind: str | None, action: str | None) -> None:
    assert action_for(key, kind) == action


def test_no_key_means_two_things_on_one_line_and_every_key_is_listed() -> None:
    help_text = "\n".join(help_lines())
    for kind in ("server", "job", "workspace"):
        bound: dict[str, str] = {}
        for k in KEYMAP:
            if not k.kinds or kind in k.kinds:
                for key in k.keys:
                    assert key not in bound or (not k.kinds), (
                        f"{key} on a {kind}: {bound[key]} and {k.action}"
                    )
                    bound.setdefault(key, k.action)
        # j no longer submits anywhere: it moves, as in every pager.
        assert action_for("j", kind) == "down"
        for key, _ in footer_keys(kind):
            assert action_for({"Enter": "enter"}.get(key, key), kind) is not None, (kind, key)
    for k in KEYMAP:
        assert k.label in help_text


# --------------------------------------------------------------- columns


@pytest.mark.parametrize("width", [80, 100, 110, 150, 200])
def test_every_line_fits_the_terminal_and_wide_ones_show_more(width: int) -> None:
    shown = lines(app(width), width)
    assert all(len(x) <= width for x in shown), "\n".join(shown)
    heading = next(x for x in shown if x.lstrip().startswith("JOBID"))
    assert ("SUBMITTED" in heading) == (width >= 110)
    assert ("USER" in heading) == (width >= 150)
    assert "ELAPSED" in heading and "LEFT" in heading
    assert reason_width(width, job_columns(width)) >= 12


def test_a_long_pending_reason_wraps_whole_at_80_columns() -> None:
    a = app(80)
    [row] = [r for r in a.rows() if isinstance(r, Row) and r.kind == "job" and r.item["job_id"] == "4"]
    text = [line.decode().rstrip() for line in row.render((80,)).text]
    assert len(text) > 2 and text[0].split()[:3] == ["4", "eval", "PENDING"]
    # The reason column starts where it starts on the first line and holds every word.
    col = text[0].index("#1")
    assert all(len(t) <= 80 for t in text)
    joined = " ".join(t[col:].strip() for t in text)
    assert joined == f"#1 {LONG_REASON}"


def test_the_gpu_line_shows_bars_and_a_history() -> None:
    shown = lines(app(80), 80)
    gpu0 = next(x for x in shown if "GPU0" in x)
    assert re.search(
        r"GPU0 rtx4090\s+\[████░░░░\]\s+45%\s+ ▁▂▃▅▇█▇▄ \[████░░░░\] 12\.0/24\.0G\s+jobs 3", gpu0
    ), gpu0
    wide = next(x for x in lines(app(160), 160) if "GPU0" in x)
    assert wide.count("▁▂▃▅▇█▇▄") == 2, wide  # memory's history too, when wide


# ------------------------------------------------------------ sparklines


def test_sparklines() -> None:
    assert sparkline([], 5) == "     "
    assert sparkline([0.0, 1.0], 4) == "  ▁█"
    assert sparkline([i / 10 for i in range(20)], 5) == "█████"  # the newest five, clamped
    assert sparkline([0.5, None, 0.5], 3) == "▅ ▅"
    assert sparkline([1.0], 0) == ""
    assert [bar_cells(f, 8) for f in (0, 0.001, 0.5, 0.99, 1.5, -1)] == [0, 1, 4, 8, 8, 0]
    h = GpuHistory()
    for i in range(100):
        h.add({"util": i, "vram_total": 0, "vram_used": 5})
    assert len(h.util) == 60 and h.util[-1] == 0.99 and set(h.mem) == {0.0}
    assert gpu_layout(80).spark < gpu_layout(120).spark < gpu_layout(200).spark


# ----------------------------------------------------------------- times


@pytest.mark.parametrize(
    ("job", "ran", "left", "shown"),
    [
        ({"state": "PENDING", "time_limit": 600}, None, 600, "10m00s"),
        ({"state": "PENDING", "time_limit": None}, None, None, "nolimit"),
        ({"state": "RUNNING", "start_time": NOW - 90, "time_limit": 3600}, 90, 3510, "58m30s"),
        ({"state": "RUNNING", "start_time": NOW - 7200, "time_limit": 3600}, 7200, 0, "0s"),
        (
            {"state": "COMPLETED", "start_time": NOW - 500, "end_time": NOW - 100, "time_limit": 600},
            400,
            None,
            "-",
        ),
        ({"state": "CANCELLED", "start_time": None, "end_time": NOW, "time_limit": 600}, None, None, "-"),
    ],
)
def test_elapsed_and_remaining(job: dict, ran: float | None, left: float | None, shown: str) -> None:
    assert elapsed(job, NOW) == ran
    assert remaining(job, NOW) == left
    assert left_text(job, NOW) == shown


def test_durations() -> None:
    assert [duration(s) for s in (0, 59, 60, 3599, 3600, 86399, 86400, 10**7, -5)] == [
        "0s",
        "59s",
        "1m00s",
        "59m59s",
        "1h00m",
        "23h59m",
        "1d00h",
        "115d17h",
        "0s",
    ]


def test_job_details_hold_everything_in_full() -> None:
    d = dict(job_details({**jobs()[1], "reason_detail": "and more"}, "gpu01", NOW))
    assert d["reason"] == f"#1 {LONG_REASON}: and more"
    assert d["time left"] == "nolimit" and d["elapsed"] == "-"
    d = dict(job_details(jobs()[0], "gpu01", NOW))
    assert d["time left"] == "47m55s (limit 1h00m)" and d["elapsed"] == "12m05s"


# ------------------------------------------------------------ this month's usage

#: A `job.usage` answer by gpu_type, as the daemon gives it (mtgpu/api/jobs.py).
USAGE = {
    "cluster": "lab",
    "start": "2026-12-01",
    "end": "2026-12-31",
    "by": ["gpu_type"],
    "rows": [
        {"gpu_type": "", "jobs": 2, "gpu_hours": 0.0, "cpu_hours": 1.0},
        {"gpu_type": "rtx4090", "jobs": 3, "gpu_hours": 12.5, "cpu_hours": 4.0},
        {"gpu_type": "a100", "jobs": 1, "gpu_hours": 0.001, "cpu_hours": 0.5},
    ],
    "total": {"jobs": 6, "gpu_hours": 12.501, "cpu_hours": 5.5},
    "cut_months": [],
}


def test_the_months_usage_is_read_from_the_job_usage_answer() -> None:
    u = month_usage(USAGE)
    assert u == {
        "month": "2026-12",
        "start": "2026-12-01",
        "end": "2026-12-31",
        "jobs": 6,
        "gpu_hours": {"a100": 0.001, "rtx4090": 12.5},  # CPU-only jobs have no GPU type
        "cpu_hours": 5.5,
    }
    assert usage_text(u) == "usage 2026-12: 6 jobs  GPU-hours a100 <0.01, rtx4090 12.50  CPU-hours 5.50"
    one = month_usage({**USAGE, "rows": [], "total": {"jobs": 1, "cpu_hours": 0.0}})
    assert usage_text(one) == "usage 2026-12: 1 job  GPU-hours 0  CPU-hours 0"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ([], "not an object"),
        ({**USAGE, "total": None}, "no total or rows"),
        ({**USAGE, "start": 7}, "no period"),
        ({**USAGE, "rows": [{"gpu_hours": 1}]}, "a row has no GPU type"),
        ({**USAGE, "rows": [{"gpu_type": "x", "gpu_hours": "1e400"}]}, "gpu_hours is not a number"),
        ({**USAGE, "rows": [{"gpu_type": "x", "gpu_hours": -1}]}, "gpu_hours is not a number"),
        ({**USAGE, "total": {"jobs": True, "cpu_hours": 0}}, "jobs is not a count"),
        ({**USAGE, "total": {"jobs": 1, "cpu_hours": float("nan")}}, "cpu_hours is not a number"),
    ],
)
def test_an_answer_of_another_shape_is_refused_naming_what_is_wrong(answer: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        month_usage(answer)


def test_the_server_line_shows_the_usage_or_why_it_is_not_available() -> None:
    a = app(80)
    st = a.fleet.states["gpu01"]
    out = lines(a, 80)
    assert not [x for x in out if "usage" in x]  # not read yet: no line at all
    st.usage = month_usage(USAGE)
    out = lines(a, 80)
    i = out.index("   usage 2026-12: 6 jobs  GPU-hours a100 <0.01, rtx4090 12.50  CPU-hours 5.50")
    assert out[i - 1].startswith("\u25cf gpu01") and out[i + 1].startswith("   GPU0")
    details = dict(a.server_details(st))
    assert details["your usage"].startswith("usage 2026-12: 6 jobs")
    assert details["period"] == "2026-12-01 to 2026-12-31 (UTC days)"
    st.usage, st.usage_error = (
        None,
        usage_refused("unknown_op", "unknown operation 'job.usage'; known: " + "x, " * 99),
    )
    out = lines(a, 80)
    assert "   usage: not available (this server runs an MTGPU older than usage reporting)" in " ".join(out)
    assert any(x.startswith("   GPU0") for x in out) and any(x.lstrip().startswith("3 ") for x in out)
    assert dict(a.server_details(st))["your usage"].startswith("usage: not available")
    assert usage_refused("internal", "E" * 500) == "E" * 159 + "\u2026"


# ------------------------------------------------------------- hostile


def test_a_tenants_job_name_and_reason_cannot_write_to_the_terminal() -> None:
    """A job name or reason with terminal escapes (a tenant chooses both) is drawn as
    visible text in the list, wrapped reasons included, and in the filter line."""
    evil = {
        **jobs()[1],
        "name": "\x1b]0;owned\x07x\x1b[2J",
        "reason": "\x1b[31mred\x1b[0m " * 20,
    }
    a = app(80, [evil])
    a.set_filter("\x1b[2J")
    out = "\n".join(lines(a, 80))
    a.set_filter("")
    out += "\n".join(lines(a, 80)) + str(a.header.text)
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[31mred" in out


def test_a_servers_usage_texts_cannot_write_to_the_terminal() -> None:
    """A GPU type or a refusal's message comes from the server: drawn as visible text."""
    a = app(80)
    st = a.fleet.states["gpu01"]
    st.usage = month_usage({**USAGE, "rows": [{"gpu_type": "\x1b[2Jevil", "gpu_hours": 1.0}]})
    out = "\n".join(lines(a, 80))
    st.usage, st.usage_error = None, usage_refused("internal", "\x1b]0;owned\x07")
    out += "\n".join(lines(a, 80))
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2Jevil 1.00" in out and "not available (\\x1b]0;owned\\x07)" in out


@pytest.mark.parametrize(
    "job, reason",
    [
        ({"state": "COMPLETED", "exit_code": 0}, "exit 0"),
        ({"state": "FAILED", "exit_code": 3, "reason": "NonZeroExitCode"}, "exit 3 NonZeroExitCode"),
        ({"state": "CANCELLED", "exit_code": 0, "reason": "cancelled by alice"}, "cancelled by alice"),
        ({"state": "CANCELLED", "exit_code": 0}, ""),
    ],
)
def test_a_cancelled_job_shows_no_exit_status(job: dict, reason: str) -> None:
    assert job_cells({"job_id": 1, **job}, "gpu01", NOW)["reason"] == reason
