"""Slurm's output formats, in-process, against lines recorded from Slurm 22.05.8's own
``squeue``, ``sinfo`` and ``scontrol`` (single-node cluster, benchmarks/slurm/setup.sh).
MTGPU's one partition is ``mtgpu`` where that Slurm's was ``main``."""

from __future__ import annotations

import argparse

import pytest

from mtgpu.cli.slurm import formats
from mtgpu.cli.slurm.commands import parse_states, select_jobs
from mtgpu.cli.slurm.srun import exit_status, overrides_of, task_block
from mtgpu.text import natural_key

NOW = 1_800_000_000.0

# Recorded: `squeue` with jobs 2 (running 2 s), 3_0 (running), 3_[1-5] (pending).
SLURM_SQUEUE = """\
             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)
           3_[1-5]      main      arr     root PD       0:00      1 (Resources)
                 2      main longname     root  R       0:02      1 vm
               3_0      main      arr     root  R       0:02      1 vm"""
SLURM_SQUEUE_LONG_HEADER = (
    "             JOBID PARTITION     NAME     USER    STATE       TIME TIME_LIMI  NODES NODELIST(REASON)"
)
SLURM_SINFO = """\
PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST
main*        up   infinite      1   idle vm"""


def view(jid, state, name="arr", user="root", **kw):
    base = {
        "job_id": jid,
        "name": name,
        "user": user,
        "state": state,
        "nodes": ["vm"] if state == "RUNNING" else [],
        "reason": "Resources" if state == "PENDING" else "",
        "submit_time": NOW - 10,
        "start_time": NOW - 2 if state == "RUNNING" else None,
        "end_time": None,
        "array_id": None,
        "array_task": None,
        "gpus": [],
        "cpus": 1,
        "ram": 1 << 30,
        "time_limit": None,
    }
    if "_" in jid:
        base["array_id"], base["array_task"] = jid.split("_")[0], int(jid.split("_")[1])
    return {**base, **kw}


def slurm_shape(text: str) -> str:
    return text.replace("      main ", "     mtgpu ").replace("main*    ", "mtgpu*   ")


def test_squeue_default_matches_slurms_columns_and_collapses_pending_array_tasks() -> None:
    jobs = [view(f"3_{i}", "PENDING") for i in range(5, 0, -1)]
    jobs += [view("2", "RUNNING", name="longname_training_job"), view("3_0", "RUNNING")]
    rows = formats.collapse_pending_arrays(formats.sort_jobs(jobs))
    lines = formats.squeue_lines(rows, formats.SQUEUE_DEFAULT, NOW)
    assert "\n".join(lines) == slurm_shape(SLURM_SQUEUE)


def test_squeue_long_header_truncates_to_the_width_as_slurm_does() -> None:
    assert formats.squeue_lines([], formats.SQUEUE_LONG, NOW)[0] == slurm_shape(SLURM_SQUEUE_LONG_HEADER)


def test_squeue_custom_format_without_widths_and_no_header() -> None:
    jobs = [view("4", "PENDING", name="held"), view("2", "RUNNING", name="longname_training_job")]
    # Recorded: `squeue -h -o "%i %t %j"` prints values unpadded and untruncated.
    assert formats.squeue_lines(formats.sort_jobs(jobs), "%i %t %j", NOW, header=False) == [
        "4 PD held",
        "2 R longname_training_job",
    ]
    with pytest.raises(formats.FormatError, match="%y"):
        formats.squeue_lines(jobs, "%i %y", NOW)


def test_collapsed_ranges_and_a_single_pending_task_keeps_its_id() -> None:
    jobs = [view(f"13_{i}", "PENDING") for i in (4, 5, 6, 9, 11, 12)] + [view("14_2", "PENDING")]
    ids = [r["job_id"] for r in formats.collapse_pending_arrays(jobs)]
    assert ids == ["13_[4-6,9,11-12]", "14_2"]


def test_job_ids_sort_naturally() -> None:
    ids = ["113_10", "113_2", "113_1", "9", "114"]
    assert sorted(ids, key=natural_key) == ["9", "113_1", "113_2", "113_10", "114"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0:00"), (2, "0:02"), (61, "1:01"), (3600, "1:00:00"), (86400 + 3661, "1-01:01:01")],
)
def test_elapsed_in_slurms_time_format(seconds: int, text: str) -> None:
    assert formats.elapsed(seconds) == text


def test_sinfo_default_matches_slurm() -> None:
    nodes = [{"name": "vm", "state": "up", "gpus": [], "cpus": 2, "ram_total": 20000 << 20}]
    assert "\n".join(formats.sinfo_lines(nodes, False, None, True)) == slurm_shape(SLURM_SINFO)


def test_sinfo_groups_states_and_compresses_host_lists() -> None:
    gpu = {"index": 0, "type": "rtx4090", "jobs": []}
    busy = {"index": 0, "type": "rtx4090", "jobs": ["7"]}
    nodes = [
        {"name": "gpu01", "state": "up", "gpus": [gpu]},
        {"name": "gpu02", "state": "up", "gpus": [gpu]},
        {"name": "gpu03", "state": "up", "gpus": [busy]},
        {"name": "gpu04", "state": "drain", "gpus": [gpu]},
    ]
    lines = formats.sinfo_lines(nodes, False, "%t %D %N", False)
    assert lines == ["idle 2 gpu[01-02]", "alloc 1 gpu03", "drain 1 gpu04"]
    assert formats.sinfo_lines(nodes, True, "%N %G", False)[0] == "gpu01 gpu:rtx4090:1"


def test_sinfo_cpus_and_nodes_by_state_summary_and_long_node_lines_as_slurms() -> None:
    """``%C`` CPUS(A/I/O/T) and ``%F`` NODES(A/I/O/T) (a drained member's free CPUs
    are "other"); ``-s`` one line for the partition; ``-N -l`` Slurm 22.05's columns."""
    gpu = {"index": 0, "type": "rtx4090", "jobs": ["7"]}
    busy = {"name": "gpu01", "state": "up", "gpus": [gpu], "cpus": 8, "cpus_alloc": 2, "ram_total": 16 << 30}
    idle = {"name": "gpu02", "state": "up", "gpus": [], "cpus": 8, "ram_total": 16 << 30}
    drained = {"name": "gpu03", "state": "drain", "gpus": [], "cpus": 4, "ram_total": 8 << 30}
    nodes = [busy, idle, drained]
    assert formats.sinfo_lines(nodes, False, "%t %C", True) == [
        "STATE CPUS(A/I/O/T)",
        "alloc 2/6/0/8",
        "idle 0/8/0/8",
        "drain 0/0/4/4",
    ]
    # A member without GPUs is mixed or allocated by its CPUs, as Slurm's.
    assert formats.node_state({**idle, "cpus_alloc": 2}) == "mix"
    assert formats.node_state({**idle, "cpus_alloc": 8}) == "alloc"
    assert formats.sinfo_lines(nodes, False, None, True, summary=True) == [
        "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST",
        "mtgpu*       up   infinite          1/1/1/3 gpu[01-03]",
    ]
    assert formats.sinfo_lines(nodes, False, "%C", False, summary=True) == ["2/14/4/20"]
    long = formats.sinfo_lines([busy], True, formats.SINFO_NODES_LONG, True)
    assert (
        long[0].split()
        == "NODELIST NODES PARTITION STATE CPUS S:C:T MEMORY TMP_DISK WEIGHT AVAIL_FE REASON".split()
    )
    assert long[1].split() == [
        "gpu01",
        "1",
        "mtgpu*",
        "allocated",
        "8",
        "1:8:1",
        "16384",
        "0",
        "1",
        "(null)",
        "none",
    ]
    head = formats.sinfo_lines([busy], False, formats.SINFO_LONG, True)[0]
    assert (
        head.split() == "PARTITION AVAIL TIMELIMIT JOB_SIZE ROOT OVERSUBS GROUPS NODES STATE NODELIST".split()
    )


def test_scontrol_show_node_gives_cpualloc_and_allocmem() -> None:
    n = {"name": "gpu01", "state": "up", "gpus": [], "cpus": 8, "cpus_alloc": 3, "ram_total": 16 << 30}
    text = formats.scontrol_node({**n, "ram_alloc": 512 << 20, "ram_used": 1 << 30})
    assert "   CPUAlloc=3 CPUTot=8\n" in text
    assert "   RealMemory=16384 AllocMem=512 FreeMem=15360\n" in text


def test_scontrol_show_job_is_slurms_key_value_record() -> None:
    j = view("12", "RUNNING", name="train", exit_code=None, workdir="/w", stdout="/w/o", stderr="/w/o")
    text = formats.scontrol_job(j, NOW)
    lines = text.splitlines()
    # Recorded: "JobId=1 JobName=hostname", then lines indented by three spaces.
    assert lines[0] == "JobId=12 JobName=train"
    assert all(line.startswith("   ") and not line.startswith("    ") for line in lines[1:])
    assert "   JobState=RUNNING Reason=None" in lines
    assert "RunTime=00:00:02 TimeLimit=UNLIMITED" in text and "NodeList=vm" in text
    assert "\n" not in formats.scontrol_job(j, NOW, one_liner=True)
    failed = formats.scontrol_job({**j, "state": "FAILED", "exit_code": 3}, NOW)
    assert "ExitCode=3:0" in failed
    # Slurm's scontrol: TimeLimit=00:05:00 (squeue's %l shows 5:00).
    assert "TimeLimit=00:05:00" in formats.scontrol_job({**j, "time_limit": 300}, NOW)
    assert "TimeLimit=1-00:00:00" in formats.scontrol_job({**j, "time_limit": 86400}, NOW)


@pytest.mark.parametrize(
    "final, exit_code, reason",
    [
        (
            {"state": "FAILED", "exit_code": 3, "exit": "3:0", "reason": "the job exited with status 3"},
            "3:0",
            "NonZeroExitCode",
        ),
        ({"state": "FAILED", "exit_code": 0, "signal": 11, "exit": "0:11"}, "0:11", "RaisedSignal:11"),
        (
            {
                "state": "TIMEOUT",
                "exit_code": 0,
                "signal": 15,
                "exit": "0:15",
                "reason": "time limit reached",
            },
            "0:15",
            "TimeLimit",
        ),
        (
            {
                "state": "CANCELLED",
                "exit_code": 0,
                "signal": 15,
                "exit": "0:15",
                "reason": "cancelled by ann",
            },
            "0:15",
            "None",
        ),
        ({"state": "COMPLETED", "exit_code": 0, "exit": "0:0"}, "0:0", "None"),
        ({"state": "PENDING", "reason": "waiting for job 12 to end"}, "0:0", "waiting_for_job_12_to_end"),
    ],
)
def test_scontrol_show_job_gives_slurms_exit_code_and_one_word_reasons(final, exit_code, reason) -> None:
    """A signal's end is ExitCode 0:SIG as in sacct, and every field of ``scontrol -o``
    is one key=value word (a reason of several words broke parsing)."""
    j = view("12", "RUNNING", exit_code=None, workdir="/w", stdout="/w/o", stderr="/w/o")
    line = formats.scontrol_job({**j, **final}, NOW, one_liner=True)
    fields = dict(f.split("=", 1) for f in line.split())
    assert all("=" in f for f in line.split()), line
    assert fields["ExitCode"] == exit_code and fields["Reason"] == reason, line


def test_a_pending_jobs_gpu_request_is_shown_before_it_runs() -> None:
    j = view("12", "PENDING", req_gpus=2, req_nodes=2)
    assert "TRES=cpu=1,node=2,gres/gpu=4" in formats.scontrol_job(j, NOW)
    assert formats.squeue_lines([j], "%i %b", NOW, header=False) == ["12 gres/gpu:2"]
    assert formats.slurm_job_json(j, NOW)["gpus"] == 4


def test_json_job_ids_are_integers_as_slurms() -> None:
    """``squeue``/``scontrol --json``: ``job_id`` is a number, an array task's its own
    (its SLURM_JOB_ID), and ``array_job_id`` the array's."""
    assert formats.slurm_job_json(view("12", "RUNNING"), NOW)["job_id"] == 12
    task = formats.slurm_job_json(view("15_3", "PENDING", numeric_id="19"), NOW)
    assert (task["job_id"], task["array_job_id"], task["array_task_id"]) == (19, 15, 3)
    assert formats.json_id("15_[1-9]") == "15_[1-9]"


def test_squeue_json_fields_have_slurm_22_05s_shapes() -> None:
    """openapi v0.0.38 (what squeue 22.05 prints): ``job_state`` one word,
    ``array_job_id`` 0 outside an array and ``array_task_id`` null, ``exit_code`` the
    wait status (``exit 3``: 768; a SIGSEGV: 11), ``time_limit`` minutes or null."""
    j = formats.slurm_job_json(view("12", "COMPLETED", exit="3:0", exit_code=3, time_limit=300.0), NOW)
    assert (j["job_state"], j["array_job_id"], j["array_task_id"]) == ("COMPLETED", 0, None)
    assert (j["exit_code"], j["time_limit"]) == (768, 5)
    segv = formats.slurm_job_json(view("13", "FAILED", exit="0:11", exit_code=-11), NOW)
    assert (segv["exit_code"], segv["time_limit"]) == (11, None)
    assert formats.slurm_job_json(view("14", "RUNNING", exit_code=None), NOW)["exit_code"] == 0


def test_states_accept_slurms_codes_and_names_and_name_a_bad_one() -> None:
    assert parse_states("PD,r") == {"PENDING", "RUNNING"}
    assert parse_states("completed") == {"COMPLETED"}
    with pytest.raises(ValueError, match="Invalid job state specified: BOGUS"):
        parse_states("BOGUS")


def test_select_jobs_by_array_id_state_and_name() -> None:
    jobs = [view("3_1", "PENDING"), view("3_0", "RUNNING"), view("4", "RUNNING", name="x")]
    assert [j["job_id"] for j in select_jobs(jobs, None, ["3"], None, None)] == ["3_1", "3_0"]
    assert [j["job_id"] for j in select_jobs(jobs, {"RUNNING"}, None, ["x"], None)] == ["4"]


def test_srun_spreads_tasks_in_blocks_and_exits_with_the_worst() -> None:
    assert [task_block(5, 2, r) for r in (0, 1)] == [(0, 3), (3, 2)]
    assert [task_block(3, 1, 0)] == [(0, 3)]
    assert task_block(1, 2, 1) == (1, 0)
    assert exit_status([0, 3, 1]) == 3 and exit_status([0, -9]) == 137 and exit_status([]) == 0


def test_srun_outside_a_job_turns_its_options_into_job_overrides() -> None:
    from mtgpu.cli.slurm.srun import build_parser

    args: argparse.Namespace = build_parser().parse_args(
        ["--gres=gpu:2", "--mem", "512", "-t", "5", "python", "x"]
    )
    assert overrides_of(args) == {"gpus": "2", "ram": "512M", "time": "5", "name": "python"}


def test_slurm_parsers_keep_slurms_options_and_mt_jobs_own() -> None:
    """The parsers ``--help``, completion and manual pages are made from are the ones
    the commands parse with: squeue's and sinfo's ``-h`` is ``--noheader``, sbatch and
    salloc take every option of ``mt-job submit`` and ``mt-job alloc``, and a bad
    sbatch option still exits 255."""
    from mtgpu.cli.job import OVERRIDES
    from mtgpu.cli.job import build_parser as mt_job_parser
    from mtgpu.cli.slurm.commands import build_parser, sbatch_main
    from mtgpu.cmdline import options, walk

    for prog in ("squeue", "sinfo"):
        p = build_parser(prog)
        assert p.parse_args(["-h"]).noheader is True
        assert {"--help", "--noheader", "--version"} <= set(options(p))
    sbatch = build_parser("sbatch")
    assert vars(sbatch.parse_args(["--gpus=1", "--parsable", "x.sh"]))["sbatch_gpus"] == "1"
    assert {f"--{k}" for k in OVERRIDES} <= {s for a in sbatch._actions for s in a.option_strings}
    mt_alloc = next(p for path, p in walk(mt_job_parser()) if path == ("alloc",))
    # Slurm's -V beside the --version every program has.
    assert set(options(mt_alloc)) | {"--version", "-V"} == set(options(build_parser("salloc")))
    assert sbatch_main(["--no-such-option", "x.sh"]) == 255


def test_an_array_tasks_numeric_id_is_slurms_raw_id_and_names_the_task() -> None:
    task = {**view("13_1", "RUNNING"), "array_id": "13", "array_task": 1, "numeric_id": "15"}
    plain = {**view("20", "RUNNING"), "numeric_id": "20"}
    # %i is the id as shown, %A the job's own numeric one (Slurm's "unique per element").
    assert formats.squeue_lines([task, plain], "%i %A %F %K", NOW, header=False) == [
        "13_1 15 13 1",
        "20 20 20 N/A",
    ]
    assert formats.named(task, ["15"]) and formats.named(task, ["13"]) and not formats.named(plain, ["15"])
    pending = [
        {**view(f"13_{i}", "PENDING"), "array_id": "13", "array_task": i, "numeric_id": str(14 + i)}
        for i in range(2, 5)
    ]
    (row,) = formats.collapse_pending_arrays(pending)
    assert (row["job_id"], row["numeric_id"]) == ("13_[2-4]", "13")


def test_scontrol_says_whether_a_job_holds_its_members_whole() -> None:
    assert "OverSubscribe=NO" in formats.scontrol_job({**view("12", "RUNNING"), "exclusive": True}, NOW)
    assert "OverSubscribe=OK" in formats.scontrol_job(view("12", "RUNNING"), NOW)


def test_host_lists_expand_as_slurms_and_a_bad_one_is_named() -> None:
    assert formats.expand_hostlist("node[01-03,07],gpu1") == ["node01", "node02", "node03", "node07", "gpu1"]
    assert formats.expand_hostlist("n[9-11]") == ["n9", "n10", "n11"]
    assert formats.expand_hostlist("r[1-2]n[08-09] solo") == ["r1n08", "r1n09", "r2n08", "r2n09", "solo"]
    assert formats.compress_hostlist(formats.expand_hostlist("gpu01,gpu02,gpu03,login")) == "gpu[01-03],login"
    for bad in ("node[1-", "node]", "node[3-1]", "node[a]", "node[]", "n[[1]]", "n[0-99999999]"):
        with pytest.raises(formats.HostlistError):
            formats.expand_hostlist(bad)


def test_scontrol_show_hostnames_and_hostlist_without_a_daemon(monkeypatch, capsys) -> None:
    from mtgpu.cli.slurm.commands import scontrol_main

    assert scontrol_main(["show", "hostnames", "node[01-03,07],gpu1"]) == 0
    assert capsys.readouterr().out.split() == ["node01", "node02", "node03", "node07", "gpu1"]
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[02-03]")
    assert scontrol_main(["show", "hostnames"]) == 0
    assert capsys.readouterr().out == "gpu02\ngpu03\n"
    assert scontrol_main(["show", "hostlist", "a1,a2,a3,b"]) == 0
    assert capsys.readouterr().out == "a[1-3],b\n"
    assert scontrol_main(["show", "hostnames", "node[1-"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scontrol: error: invalid host list 'node[1-'")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    assert scontrol_main(["show", "hostnames"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SLURM_JOB_NODELIST" in err


def test_scancel_takes_array_task_ranges_and_names_a_bad_one() -> None:
    from mtgpu.cli.slurm.commands import MAX_TASK_RANGE, expand_task_ranges, scancel_main

    assert expand_task_ranges(["20_[6-7]", "20_[1,3-4,3]", "21_2", "22"]) == [
        "20_6",
        "20_7",
        "20_1",
        "20_3",
        "20_4",
        "21_2",
        "22",
    ]
    for bad in ("20_[6-", "20_[7-6]", "20_[x]", "20[1]", f"20_[0-{MAX_TASK_RANGE}]"):
        with pytest.raises(ValueError, match=r"^Invalid job id "):
            expand_task_ranges([bad])
    assert scancel_main(["20_[6-"]) == 1  # refused before any daemon is asked
