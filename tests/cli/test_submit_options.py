"""mt-job submit's command line: every sbatch option, parsed as sbatch parses it (in-process)."""

from __future__ import annotations

import contextlib
import io

import pytest

from mtgpu.cli.job import build_parser, submit_argv
from mtgpu.schedd import sbatch
from mtgpu.schedd.jobfile import parse_job_file


def parsed(*argv: str):
    return build_parser().parse_args(submit_argv(["submit", *argv]))


def test_help_shows_every_option() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parsed("--help")
    text = out.getvalue()
    for o in sbatch.OPTIONS:
        assert o.long in text, o.long
        if o.short:
            assert f"-{o.short}" in text, o.short
    for key in ("--gpu-mode", "--vram", "--parsable", "--json"):
        assert key in text


@pytest.mark.parametrize(
    ("argv", "options", "file"),
    [
        (["-J", "name", "job.sh"], ["--job-name=name"], "job.sh"),
        (["-Jname", "-c4", "job.sh"], ["--job-name=name", "--cpus-per-task=4"], "job.sh"),
        (["--exclusive", "job.sh"], ["--exclusive"], "job.sh"),  # an optional value must be attached
        (["--nice", "-"], ["--nice"], "-"),
        (["--requeue=yes", "-d", "afterok:3", "job.sh"], ["--requeue", "--dependency=afterok:3"], "job.sh"),
        (["--mem", "4G", "--gres=gpu:a100:1", "--", "job.sh"], ["--mem=4G", "--gres=gpu:a100:1"], "job.sh"),
    ],
)
def test_submit_parses_as_sbatch(argv: list[str], options: list[str], file: str) -> None:
    args = parsed(*argv)
    assert sorted(sbatch.argv_of(args)) == sorted(options) and args.file == file


def test_command_line_options_are_read_by_the_same_code_as_the_file() -> None:
    """What the CLI sends is what the daemon parses: the same option on either side
    means the same, and the command line wins."""
    args = parsed("-J", "cli", "-c", "3", "--mem-per-cpu=1G", "--gpus=2", "job.sh")
    spec = parse_job_file(
        "#!/bin/bash\n#SBATCH -J file -c 1\ntrue\n", default_workdir="/w", options=sbatch.argv_of(args)
    )
    assert (spec.name, spec.request.cpus, spec.request.ram, spec.request.gpus) == ("cli", 3, 3 << 30, 2)
    bad = parsed("--reservation=x", "job.sh")
    with pytest.raises(Exception, match=r"^command line: --reservation=x: --reservation is refused"):
        parse_job_file("true\n", default_workdir="/w", options=sbatch.argv_of(bad))
