"""Job files: #MTGPU directives, #SBATCH options, overrides and error messages."""

from __future__ import annotations

import pytest

from mtgpu.errors import JobError
from mtgpu.schedd.jobfile import (
    check_priority,
    expand_array,
    expand_hostlist,
    expand_output_pattern,
    parse_array,
    parse_gpus,
    parse_job_file,
)
from mtgpu.schedd.types import DEFAULT_CPUS, DEFAULT_PRIORITY, DEFAULT_RAM, GpuMode, JobSpec

G = 1 << 30
M = 1 << 20


def parse(*directives: str, overrides: dict[str, str] | None = None, **kw: object) -> JobSpec:
    text = "#!/bin/bash\n" + "".join(d + "\n" for d in directives) + "python train.py\n"
    return parse_job_file(text, overrides, default_workdir="/home/ann/proj", **kw)  # type: ignore[arg-type]


def field(spec: JobSpec, name: str) -> object:
    return getattr(spec.request, name) if hasattr(spec.request, name) else getattr(spec, name)


# ------------------------------------------------------------------- #MTGPU directives


@pytest.mark.parametrize(
    ("directive", "expected"),
    [
        ("gpus=2", {"gpus": 2, "gpu_brand": None, "gpu_type": None, "gpu_mode": GpuMode.EXCLUSIVE}),
        ("gpus=nvidia:4", {"gpus": 4, "gpu_brand": "nvidia", "gpu_type": None}),
        ("gpus=amd:1", {"gpus": 1, "gpu_brand": "amd"}),
        ("gpus=intel:2", {"gpus": 2, "gpu_brand": "intel"}),
        ("gpus=a100:2", {"gpus": 2, "gpu_brand": None, "gpu_type": "a100"}),
        ("gpus=nvidia:rtx4090:3", {"gpus": 3, "gpu_brand": "nvidia", "gpu_type": "rtx4090"}),
        ("gpus=h100", {"gpus": 1, "gpu_type": "h100"}),
        ("gpus=NVIDIA:2", {"gpus": 2, "gpu_brand": "nvidia"}),
        ("gpus=0", {"gpus": 0}),
        ("gpus=1 vram=20G", {"gpu_mode": GpuMode.SHARED, "vram": 20 * G}),
        ("gpus=1 gpu_mode=shared vram=10G", {"gpu_mode": GpuMode.SHARED, "vram": 10 * G}),
        ("gpus=1 gpu_mode=overcommit vram=8G", {"gpu_mode": GpuMode.OVERCOMMIT, "vram": 8 * G}),
        ("gpus=1 gpu_mode=exclusive vram=40G", {"gpu_mode": GpuMode.EXCLUSIVE, "vram": 40 * G}),
        ("gpus=1 gpu_mode=exclusive", {"gpu_mode": GpuMode.EXCLUSIVE, "vram": 0}),
        ("vram=1.5G gpus=1", {"vram": int(1.5 * G)}),
        ("cpus=16", {"cpus": 16}),
        ("ram=32G", {"ram": 32 * G}),
        ("ram=512M", {"ram": 512 * M}),
        ("ram=1T", {"ram": 1 << 40}),
        ("nodes=2 gpus=nvidia:4", {"nodes": 2, "gpus": 4}),
        ("container=pytorch:24.01", {"container": "pytorch:24.01"}),
        ("array=0-9", {"array": "0-9", "array_limit": None}),
        ("array=0-99%8", {"array": "0-99%8", "array_limit": 8}),
        ("server=gpu01", {"servers": ("gpu01",)}),
        ("server=gpu01,gpu02", {"servers": ("gpu01", "gpu02")}),
        ("server=gpu[01-03]", {"servers": ("gpu01", "gpu02", "gpu03")}),
        ("name=train", {"name": "train"}),
        ("priority=5", {"priority": 5}),
        ("priority=0", {"priority": 0}),
        ("priority=100", {"priority": 100}),
        ("time=2h", {"time_limit": 7200}),
        ("time=1-12:00:00", {"time_limit": 129600}),
        ("time=unlimited", {"time_limit": None}),
        ("output=logs/%j.out", {"output": "logs/%j.out"}),
        ("error=logs/%j.err", {"error": "logs/%j.err"}),
        ("workdir=/scratch/ann", {"workdir": "/scratch/ann"}),
        ("workdir=sub/dir", {"workdir": "/home/ann/proj/sub/dir"}),
        ("requeue=yes", {"requeue": True}),
        ("requeue=no", {"requeue": False}),
        ("requeue=true", {"requeue": True}),
        ('name="my job"', {"name": "my job"}),
        ("gpus=1   # one is enough", {"gpus": 1}),
        ("gpu-mode=shared gpus=1 vram=4G", {"gpu_mode": GpuMode.SHARED}),
    ],
)
def test_directive(directive: str, expected: dict[str, object]) -> None:
    spec = parse("#MTGPU " + directive)
    for name, value in expected.items():
        assert field(spec, name) == value, name


def test_defaults() -> None:
    spec = parse()
    assert spec.request.gpus == 0 and spec.request.nodes == 1
    assert spec.request.cpus == DEFAULT_CPUS and spec.request.ram == DEFAULT_RAM
    assert spec.priority == DEFAULT_PRIORITY and spec.time_limit is None
    assert spec.name == "job" and spec.workdir == "/home/ann/proj"
    assert spec.output is None and spec.error is None  # the runner's ~/.mtgpu/jobs/ID/
    assert not spec.requeue and spec.container is None and spec.array is None
    assert spec.warnings == ()


def test_array_default_output_and_name() -> None:
    spec = parse("#MTGPU array=1-3", default_name="train.sh")
    assert spec.output is None and spec.name == "train.sh"


def test_many_directives_on_lines_like_the_design() -> None:
    spec = parse(
        "#MTGPU gpus=nvidia:1 gpu_mode=shared vram=20G cpus=4 ram=32G",
        "#MTGPU container=IMAGE nodes=2 array=0-9%4 server=gpu01,gpu02 name=train priority=5 time=2h",
    )
    r = spec.request
    assert (r.gpus, r.gpu_brand, r.gpu_mode, r.vram, r.cpus, r.ram, r.nodes) == (
        1,
        "nvidia",
        GpuMode.SHARED,
        20 * G,
        4,
        32 * G,
        2,
    )
    assert spec.gpus_total == 2
    assert (spec.container, spec.array, spec.array_limit, spec.name, spec.priority, spec.time_limit) == (
        "IMAGE",
        "0-9%4",
        4,
        "train",
        5,
        7200,
    )


def test_later_directive_of_the_same_kind_wins() -> None:
    assert parse("#MTGPU cpus=2", "#MTGPU cpus=8").request.cpus == 8
    assert parse("#SBATCH -c 2", "#SBATCH -c 4").request.cpus == 4
    assert parse("#SBATCH --mem=1G", "#SBATCH --mem=3G").request.ram == 3 * G


def test_mem_0_asks_for_all_of_each_members_memory_as_slurm() -> None:
    """sbatch's --mem=0 (and 0G, mt-job's --mem 0): all of each member's memory, so
    the job holds its members whole; it was refused."""
    for directive in ("#SBATCH --mem=0", "#SBATCH --mem=0G", "#MTGPU ram=0"):
        req = parse(directive).request
        assert (req.ram, req.whole_member) == (0, True), directive
    assert "all its RAM" in parse("#SBATCH --mem=0").request.describe()
    # The same setting in both kinds of line, with the same value, is no conflict.
    assert parse("#SBATCH -c 4", "#MTGPU cpus=4").request.cpus == 4
    assert parse("#MTGPU gpus=2", "#SBATCH --gpus=2").request.gpus == 2


@pytest.mark.parametrize(
    ("first", "second", "setting"),
    [
        ("#MTGPU gpus=1", "#SBATCH --gpus=2", "gpus"),
        ("#MTGPU gpus=1", "#SBATCH --gres=gpu:2", "gres"),
        ("#SBATCH -c 2", "#MTGPU cpus=4", "cpus"),
        ("#MTGPU ram=4G", "#SBATCH --mem-per-cpu=1G", "mem"),
        ("#MTGPU time=1h", "#SBATCH -t 2:00:00", "time"),
        ("#SBATCH -J a", "#MTGPU name=b", "name"),
        ("#MTGPU priority=10", "#SBATCH --nice=5", "priority"),
    ],
)
def test_conflicting_directives_are_refused_naming_both_lines(first: str, second: str, setting: str) -> None:
    with pytest.raises(JobError) as exc:
        parse(first, second)
    msg = str(exc.value)
    assert msg.startswith(f"line 3: {second} conflicts with line 2: {first}"), msg
    assert "keep one" in msg


def test_exclusive_sbatch_memory_options_are_refused_together() -> None:
    with pytest.raises(
        JobError, match=r"line 3: #SBATCH --mem-per-gpu=4G conflicts with line 2: #SBATCH --mem=1G"
    ):
        parse("#SBATCH --mem=1G", "#SBATCH --mem-per-gpu=4G --gpus=1")


def test_the_command_line_wins_over_either_kind_of_line() -> None:
    spec = parse("#MTGPU cpus=2", "#SBATCH --mem-per-cpu=1G", options=["-c", "6", "--mem=3G"])
    assert (spec.request.cpus, spec.request.ram) == (6, 3 * G)


def test_directives_stop_at_first_command() -> None:
    text = "#!/bin/bash\n#MTGPU gpus=1\n\n# a comment\n#MTGPU cpus=4\necho hi\n#MTGPU cpus=64\n#SBATCH -N 9\n"
    spec = parse_job_file(text, default_workdir="/h")
    assert spec.request.cpus == 4 and spec.request.nodes == 1
    assert spec.script == text


@pytest.mark.parametrize(
    "line",
    ["# MTGPU gpus=4", " #MTGPU gpus=4", "#MTGPUgpus=4", "##MTGPU gpus=4", "#SBATCHX -N 3", "# SBATCH -N 3"],
)
def test_not_a_directive(line: str) -> None:
    spec = parse(line)
    assert spec.request.gpus == 0 and spec.request.nodes == 1


def test_no_shebang_still_reads_directives() -> None:
    spec = parse_job_file("#MTGPU gpus=2\nrun\n", default_workdir="/h")
    assert spec.request.gpus == 2


# ------------------------------------------------------------------- #SBATCH options


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("-J train", {"name": "train"}),
        ("-Jtrain", {"name": "train"}),
        ("--job-name=train", {"name": "train"}),
        ("--job-name train", {"name": "train"}),
        ("-c 8", {"cpus": 8}),
        ("-c8", {"cpus": 8}),
        ("--cpus-per-task=8", {"cpus": 8}),
        ("--cpus-per-task 8", {"cpus": 8}),
        ("--mem=4000", {"ram": 4000 * M}),
        ("--mem=16G", {"ram": 16 * G}),
        ("--mem 2G", {"ram": 2 * G}),
        ("-N 2", {"nodes": 2}),
        ("-N2", {"nodes": 2}),
        ("--nodes=2", {"nodes": 2}),
        ("--nodes 3", {"nodes": 3}),
        ("--gres=gpu:2", {"gpus": 2, "gpu_type": None}),
        ("--gres=gpu:a100:2", {"gpus": 2, "gpu_type": "a100"}),
        ("--gres=gpu", {"gpus": 1}),
        ("--gres=gpu:nvidia:1", {"gpus": 1, "gpu_brand": "nvidia"}),
        ("--gpus=2", {"gpus": 2}),
        ("--gpus=a100:2", {"gpus": 2, "gpu_type": "a100"}),
        ("-G 3", {"gpus": 3}),
        ("-N 2 --gpus=8", {"nodes": 2, "gpus": 4}),
        ("--gpus-per-node=4 -N 2", {"nodes": 2, "gpus": 4}),
        ("-a 0-9", {"array": "0-9"}),
        ("--array=0-99%5", {"array": "0-99%5", "array_limit": 5}),
        ("-a1,3,5", {"array": "1,3,5"}),
        ("-w gpu01", {"servers": ("gpu01",)}),
        ("--nodelist=gpu[01-02]", {"servers": ("gpu01", "gpu02")}),
        ("-o out.txt", {"output": "out.txt"}),
        ("--output=%x-%j.out", {"output": "%x-%j.out"}),
        ("-e err.txt", {"error": "err.txt"}),
        ("--error=e.txt", {"error": "e.txt"}),
        ("-t 30", {"time_limit": 1800}),
        ("-t 1-00:00:00", {"time_limit": 86400}),
        ("--time=02:00:00", {"time_limit": 7200}),
        ("--time 45:00", {"time_limit": 2700}),
        ("-D /scratch", {"workdir": "/scratch"}),
        ("--chdir=run", {"workdir": "/home/ann/proj/run"}),
        ("--requeue", {"requeue": True}),
        ("--no-requeue", {"requeue": False}),
        ("-J a -c 2 --mem=1G", {"name": "a", "cpus": 2, "ram": G}),
    ],
)
def test_sbatch(line: str, expected: dict[str, object]) -> None:
    spec = parse("#SBATCH " + line)
    for name, value in expected.items():
        assert field(spec, name) == value, name
    assert spec.warnings == ()


@pytest.mark.parametrize(
    "line",
    [
        "--mail-type=ALL",
        "--mail-user=ann@example.org",
        "-p gpu",
        "--partition=gpu",
        "--account proj",
        "-A proj",
        "--qos=high",
        "--comment=x",
        "--time-min=10",
        "--gpu-bind=closest",
        "--hint=nomultithread",
        "--oversubscribe",
        "--parsable",
    ],
)
def test_sbatch_option_without_effect_is_a_warning(line: str) -> None:
    spec = parse("#SBATCH " + line, "#SBATCH -c 3")
    assert spec.request.cpus == 3
    assert len(spec.warnings) == 1
    assert spec.warnings[0].startswith(f"line 2: #SBATCH {line}: ")
    assert "is ignored: " in spec.warnings[0]


def test_every_warned_option_says_why() -> None:
    from mtgpu.schedd import sbatch

    for o in sbatch.names("warn"):
        (w,) = parse(f"#SBATCH {o.long}" + ("=x" if o.value is True else "")).warnings
        assert o.why in w, o.long


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("--gress=gpu:1", "unknown option, did you mean --gres?"),
        ("--job-nme=x", "unknown option, did you mean --job-name?"),  # --job-nam is --job-name
        ("--cpus-per-tsk=2", "unknown option, did you mean --cpus-per-task?"),
        ("--frobnicate", "unknown option; `mt-job submit --help` lists the options"),
        ("-X", "unknown option; `mt-job submit --help` lists the options"),
        ("gpu:1", "not an option"),
        ("--requeue=yes", "--requeue takes no value"),
        ("--reservation=maint", "--reservation is refused: MTGPU has no advance reservations"),
        ("--tmp=10G", "--tmp is refused: MTGPU does not schedule by local disk space"),
        ("--uid=0", "--uid is refused: a job runs as the tenant who submits it"),
        ("--gres=mps:100,gpu:1", "only GPUs"),
    ],
)
def test_sbatch_option_that_cannot_take_effect_is_refused(line: str, shown: str) -> None:
    with pytest.raises(JobError) as exc:
        parse("#SBATCH -c 2", "#SBATCH " + line)
    assert str(exc.value).startswith(f"line 3: #SBATCH {line}: "), exc.value
    assert shown in str(exc.value)


def test_every_sbatch_option_takes_effect_warns_or_is_refused() -> None:
    """No option is silently dropped: each one sets something, or warns, or refuses."""
    from mtgpu.schedd import sbatch

    plain = parse()
    for o in sbatch.OPTIONS:
        line = f"#SBATCH {o.long}" + ("=1" if o.value is True else "")
        try:
            spec = parse(line)
        except JobError as exc:
            assert o.kind in ("refuse", "set"), (o.long, exc)
            continue
        assert o.kind != "refuse", o.long
        if o.kind == "warn":
            assert spec.warnings, o.long
        else:
            assert spec != plain, o.long


def test_a_comment_after_sbatch_options_is_a_comment_whatever_it_holds() -> None:
    """sbatch ends a line's options at an unquoted #: a quote in the comment is text."""
    spec = parse("#SBATCH -o /logs/%j.out  # Default log path (can't use variables here)")
    assert spec.output == "/logs/%j.out"
    spec = parse("#SBATCH -J 'a # b' --mem=4G#no space before it")
    assert (spec.name, spec.request.ram) == ("a # b", 4 * G)
    with pytest.raises(JobError, match="line 2: #SBATCH: No closing quotation; close the quote"):
        parse("#SBATCH -J 'open")


def test_an_unambiguous_prefix_of_a_long_option_is_that_option() -> None:
    """As getopt_long, which sbatch reads #SBATCH lines with: --err is --error, an
    exact name wins over a longer one it begins, and an ambiguous prefix is refused
    naming the options it could be."""
    spec = parse("#SBATCH --err=e-%j.log --cpus-per-t=3 --gpus 2 --mail-t=END")
    assert (spec.error, spec.request.cpus, spec.request.gpus) == ("e-%j.log", 3, 2)
    assert "--mail-type is ignored" in spec.warnings[0]
    with pytest.raises(JobError, match=r"#SBATCH --cpus=4: ambiguous option: it abbreviates --cpus-per-task"):
        parse("#SBATCH --cpus=4")


def test_sbatch_flag_does_not_eat_next_option() -> None:
    spec = parse("#SBATCH --contiguous -c 4")
    assert spec.request.cpus == 4 and len(spec.warnings) == 1


@pytest.mark.parametrize(
    ("line", "cpus", "ram", "ntasks", "per_task"),
    [
        ("-n 4", 4, DEFAULT_RAM, 4, 1),
        ("-n 4 -c 2", 8, DEFAULT_RAM, 4, 2),
        ("-n 4 -c 2 --mem-per-cpu=1G", 8, 8 * G, 4, 2),
        ("--ntasks=4 -N 2", 2, DEFAULT_RAM, 4, 1),
        ("--ntasks-per-node=3 -N 2 -c 2", 6, DEFAULT_RAM, 6, 2),
        ("--gpus=2 --cpus-per-gpu=4 --mem-per-gpu=16G", 8, 32 * G, None, None),
        ("--mem-per-cpu=500 -c 2", 2, 1000 * M, None, 2),
        ("--mincpus=6", 6, DEFAULT_RAM, None, None),
        ("-c 8 --mincpus=4", 8, DEFAULT_RAM, None, 8),
    ],
)
def test_sbatch_tasks_cpus_and_memory(
    line: str, cpus: int, ram: int, ntasks: int | None, per_task: int | None
) -> None:
    spec = parse("#SBATCH " + line)
    assert (spec.request.cpus, spec.request.ram, spec.ntasks, spec.cpus_per_task) == (
        cpus,
        ram,
        ntasks,
        per_task,
    )


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("-n 3 -N 2", "3 tasks do not split evenly over 2 nodes"),
        ("--cpus-per-gpu=4", "the job asks for no GPUs"),
        ("--mem-per-gpu=4G", "the job asks for no GPUs"),
        ("-n 4 --ntasks-per-node=3", "conflicts with"),
    ],
)
def test_sbatch_tasks_refusals(line: str, shown: str) -> None:
    with pytest.raises(JobError, match=shown):
        parse("#SBATCH " + line)


def test_sbatch_nice_and_priority() -> None:
    assert parse("#SBATCH --nice=10").priority == DEFAULT_PRIORITY - 10
    assert parse("#SBATCH --nice").priority == 0
    assert parse("#SBATCH --priority=20").priority == 20


def test_sbatch_node_range_uses_minimum_with_warning() -> None:
    spec = parse("#SBATCH -N 2-4")
    assert spec.request.nodes == 2
    assert "node range" in spec.warnings[0]


# ------------------------------------------------------------------- overrides


def test_overrides_win() -> None:
    spec = parse(
        "#MTGPU gpus=1 cpus=2", "#SBATCH -t 5", overrides={"gpus": "nvidia:2", "--time": "1h", "cpus": "3"}
    )
    assert (spec.request.gpus, spec.request.gpu_brand, spec.request.cpus, spec.time_limit) == (
        2,
        "nvidia",
        3,
        3600,
    )


def test_override_beats_sbatch_total_gpus() -> None:
    spec = parse("#SBATCH --gpus=4", overrides={"gpus": "1"})
    assert spec.request.gpus == 1


def test_override_error_names_the_command_line() -> None:
    with pytest.raises(JobError, match=r"^command line: --vram=lots: .*expected a size"):
        parse(overrides={"gpus": "1", "vram": "lots"})
    with pytest.raises(
        JobError, match=r"command line: --gpuz=1: unknown directive 'gpuz'; did you mean gpus"
    ):
        parse(overrides={"gpuz": "1"})


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("#MTGPU gpus=x:y:z:1", r"line 2: #MTGPU gpus=x:y:z:1: .*expected N, BRAND:N"),
        ("#MTGPU gpus=-1", r"line 2: #MTGPU gpus=-1: .*expected N"),
        ("#MTGPU gpus=nvidia:0", r"names a GPU but asks for none"),
        (
            "#MTGPU gpu_mode=turbo gpus=1",
            r"line 2: #MTGPU gpu_mode=turbo: .*expected exclusive, shared or overcommit",
        ),
        ("#MTGPU gpus=1 gpu_mode=shared", r"line 2: #MTGPU gpu_mode=shared: .*expected vram=SIZE"),
        ("#MTGPU gpus=1 gpu_mode=overcommit", r"line 2: #MTGPU gpu_mode=overcommit: .*expected vram=SIZE"),
        ("#MTGPU vram=8G", r"line 2: #MTGPU vram=8G: vram applies to GPUs.*expected gpus=N"),
        ("#MTGPU gpu_mode=shared", r"line 2: #MTGPU gpu_mode=shared: gpu_mode applies to GPUs"),
        (
            "#MTGPU gpus=1 vram=20",
            r"line 2: #MTGPU vram=20: '20' has no unit; expected a size per GPU with a unit",
        ),
        ("#MTGPU gpus=1 vram=20X", r"line 2: #MTGPU vram=20X: '20X' is not a size; expected"),
        ("#MTGPU ram=-1G", r"line 2: #MTGPU ram=-1G: .*expected a size per member"),
        ("#MTGPU ram=32", r"has no unit"),
        ("#MTGPU cpus=0", r"line 2: #MTGPU cpus=0: .*expected a whole number of CPUs"),
        ("#MTGPU cpus=two", r"line 2: #MTGPU cpus=two: "),
        ("#MTGPU nodes=0", r"line 2: #MTGPU nodes=0: .*expected a whole number of members"),
        (
            "#MTGPU array=9-0",
            r"line 2: #MTGPU array=9-0: .*runs backwards or has a zero step; expected indices",
        ),
        ("#MTGPU array=0-9%0", r"limit after % must be a whole number"),
        ("#MTGPU array=a-b", r"line 2: #MTGPU array=a-b: .*not an array spec"),
        ("#MTGPU array=0-200000", r"more than 100000 tasks"),
        ("#MTGPU server=gpu[1-", r"line 2: #MTGPU server=gpu\[1-: .*expected a server name"),
        ("#MTGPU server=gpu01 nodes=2", r"line 2: #MTGPU server=gpu01: 1 server\(s\) cannot hold 2 members"),
        ("#MTGPU name=", r"line 2: #MTGPU name=: .*expected a job name"),
        ("#MTGPU priority=101", r"line 2: #MTGPU priority=101: .*expected a whole number from 0 to 100"),
        ("#MTGPU priority=-1", r"out of range"),
        ("#MTGPU priority=high", r"line 2: #MTGPU priority=high:"),
        ("#MTGPU time=forever", r"line 2: #MTGPU time=forever: 'forever' is not a time limit; expected MM"),
        ("#MTGPU requeue=maybe", r"line 2: #MTGPU requeue=maybe: .*expected yes or no"),
        ("#MTGPU gpus", r"line 2: #MTGPU gpus: expected key=value"),
        ("#MTGPU gpuz=1", r"line 2: #MTGPU gpuz=1: unknown directive 'gpuz'; did you mean gpus\?"),
        ("#MTGPU colour=red", r"unknown directive 'colour'; expected one of gpus, gpu_mode"),
        ('#MTGPU name="open', r"line 2: #MTGPU: .*close the quote"),
        ("#SBATCH --mem-per-cpu=0", r"line 2: #SBATCH --mem-per-cpu=0: .*not a positive size"),
        ("#SBATCH --mem=lots", r"line 2: #SBATCH --mem=lots: .*expected a size"),
        ("#SBATCH --mem", r"line 2: #SBATCH --mem: needs a value; expected --mem=VALUE"),
        ("#SBATCH -c zero", r"line 2: #SBATCH -c zero: .*expected a whole number of CPUs"),
        ("#SBATCH -t soon", r"line 2: #SBATCH -t soon: 'soon' is not a time limit"),
        ("#SBATCH --gres=shard:1", r"line 2: #SBATCH --gres=shard:1: 'shard:1': MTGPU schedules only GPUs"),
        ("#SBATCH -N 2 --gpus=3", r"line 2: #SBATCH --gpus=3: 3 GPUs do not split evenly over 2 nodes"),
    ],
)
def test_errors_name_line_directive_and_expectation(directive: str, message: str) -> None:
    with pytest.raises(JobError, match=message):
        parse(directive)


def test_error_line_number_counts_comments_and_blanks() -> None:
    text = "#!/bin/sh\n\n# about this job\n#MTGPU cpus=4\n#MTGPU ram=lots\n"
    with pytest.raises(JobError, match=r"^line 5: #MTGPU ram=lots: "):
        parse_job_file(text, default_workdir="/h")


# ------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-9", list(range(10)), None),
        ("1,3,5", [1, 3, 5], None),
        ("0-99%8", list(range(100)), 8),
        ("7", [7], None),
        ("0-10:5", [0, 5, 10], None),
        ("3,1,1-2", [1, 2, 3], None),
        ("0-3,10-11%2", [0, 1, 2, 3, 10, 11], 2),
    ],
)
def test_parse_array(text: str, indices: list[int], limit: int | None) -> None:
    assert parse_array(text) == (tuple(indices), limit)


def test_expand_array() -> None:
    assert expand_array(parse("#MTGPU array=2-4")) == [2, 3, 4]
    assert expand_array(parse()) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", (3, None, None)),
        ("nvidia:4", (4, "nvidia", None)),
        ("a100:2", (2, None, "a100")),
        ("amd:mi250:1", (1, "amd", "mi250")),
        ("a100", (1, None, "a100")),
        ("tenstorrent:1", (1, None, "tenstorrent")),
    ],
)
def test_parse_gpus(value: str, expected: tuple[int, str | None, str | None]) -> None:
    assert parse_gpus(value) == expected


def test_extra_brands() -> None:
    spec = parse("#MTGPU gpus=tenstorrent:2", brands={"nvidia", "tenstorrent"})
    assert spec.request.gpu_brand == "tenstorrent" and spec.request.gpu_type is None


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("gpu01", ("gpu01",)),
        ("a,b", ("a", "b")),
        ("gpu[1-3]", ("gpu1", "gpu2", "gpu3")),
        ("gpu[08-10],cpu1", ("gpu08", "gpu09", "gpu10", "cpu1")),
        ("n[1,3]x", ("n1x", "n3x")),
        ("a,a", ("a",)),
    ],
)
def test_expand_hostlist(value: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(value) == names


def test_check_priority() -> None:
    check_priority(DEFAULT_PRIORITY, is_admin=False)
    check_priority(0, is_admin=False)
    check_priority(90, is_admin=True)
    with pytest.raises(JobError, match="only an admin may raise a job above the default 50"):
        check_priority(51, is_admin=False)


def test_expand_output_pattern() -> None:
    assert (
        expand_output_pattern("%x-%j-%u-%N-%%.out", job_id="9", name="t", user="ann", node="gpu01")
        == "t-9-ann-gpu01-%.out"
    )
    assert (
        expand_output_pattern("%A_%a", job_id="9_2", name="t", user="u", array_id="9", array_task=2) == "9_2"
    )


def test_the_manual_lists_every_sbatch_option_with_its_effect() -> None:
    from pathlib import Path

    from mtgpu.schedd import sbatch

    text = (Path(__file__).resolve().parents[2] / "docs" / "manual.md").read_text()
    section = text[text.index("### `#SBATCH` lines") : text.index("### Command-line overrides")]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2]
        for line in section.splitlines()
        if line.startswith("| `-")
    }
    for o in sbatch.OPTIONS:
        name = f"`{o.long}`" + (f", `-{o.short}`" if o.short else "")
        assert name in rows, o.long
        said = {"refuse": "refused: ", "warn": "warning"}.get(o.kind)
        if said is None:
            assert not rows[name].strip().startswith(("refused", "warning")), (o.long, rows[name])
        else:
            assert said in rows[name], (o.long, rows[name])
    assert len(rows) == len(sbatch.OPTIONS)


def test_sbatch_exclude() -> None:
    assert parse("#SBATCH -x gpu[01-02],cpu1").request.exclude == ("gpu01", "gpu02", "cpu1")
    assert "excluding gpu01" in parse("#SBATCH --exclude=gpu01").request.describe()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("--signal=USR1@90", ("USR1@90", "truncate")),
        ("--signal=B:10 --open-mode=append", ("B:10", "append")),
        ("--open-mode=truncate", (None, "truncate")),
    ],
)
def test_sbatch_signal_and_open_mode(line: str, expected: tuple) -> None:
    spec = parse("#SBATCH " + line)
    assert (spec.signal, spec.open_mode) == expected


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("--signal=KILL", "not a signal a job can be warned with"),
        ("--signal=USR9", "is not a signal"),
        ("--signal=R:USR1", "MTGPU has no reservations"),
        ("--signal=USR1@soon", "is not a number of seconds"),
        ("--open-mode=overwrite", "is not truncate or append"),
    ],
)
def test_sbatch_signal_and_open_mode_refusals(line: str, shown: str) -> None:
    with pytest.raises(JobError, match=shown):
        parse("#SBATCH " + line)


def test_sbatch_constraint() -> None:
    assert parse("#SBATCH -C 'a100&nvlink|h100'").request.constraint == "a100&nvlink|h100"
    for bad in ("[a100|h100]", "a100*2", "a100&", "(a|b)"):
        with pytest.raises(JobError, match="is not a feature name"):
            parse(f"#SBATCH --constraint='{bad}'")


@pytest.mark.parametrize(
    ("lines", "whole"),
    [
        (("#SBATCH --exclusive",), True),
        (("#SBATCH --exclusive --gres=gpu:1",), True),  # the optional value is never the next option
        (("#MTGPU exclusive=yes",), True),
        (("#MTGPU exclusive=no",), False),
        (("#MTGPU exclusive=yes", "#SBATCH --exclusive"), True),  # the same setting: no conflict
        ((), False),
    ],
)
def test_exclusive_asks_for_whole_members(lines: tuple[str, ...], whole: bool) -> None:
    spec = parse(*lines)
    assert spec.request.whole_member is whole and spec.warnings == ()
    # It is kept with the job's record and read back from it.
    from mtgpu.jobspec import spec_from_dict, spec_to_dict

    assert spec_from_dict(spec_to_dict(spec)).request.whole_member is whole


@pytest.mark.parametrize(
    ("lines", "shown"),
    [
        (
            ("#SBATCH --exclusive=user",),
            "--exclusive=user (sharing members only with some jobs) is not supported",
        ),
        (("#SBATCH --exclusive=mcs",), "--exclusive=mcs"),
        (("#MTGPU exclusive=maybe",), "'maybe' is not yes or no"),
        (("#MTGPU exclusive=no", "#SBATCH --exclusive"), "conflicts with line 2: #MTGPU exclusive=no"),
    ],
)
def test_exclusive_that_cannot_be_honoured_is_refused_naming_the_line(
    lines: tuple[str, ...], shown: str
) -> None:
    with pytest.raises(JobError) as exc:
        parse(*lines)
    assert str(exc.value).startswith(f"line {len(lines) + 1}: ") and shown in str(exc.value), exc.value


def test_a_job_record_from_before_whole_members_reads_as_shared_members() -> None:
    from mtgpu.jobspec import spec_from_dict, spec_to_dict

    d = spec_to_dict(parse())
    del d["request"]["whole_member"]
    assert spec_from_dict(d).request.whole_member is False
