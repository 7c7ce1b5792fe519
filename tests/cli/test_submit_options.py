"""mt-job submit's command line: every sbatch option, parsed as sbatch parses it (in-process)."""

from __future__ import annotations

import contextlib
import io
import re

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


@pytest.mark.parametrize(
    ("argv", "options", "file", "script_args"),
    [
        (["job.sh", "200"], [], "job.sh", ["200"]),
        # What follows the job file is the script's, options included, as in sbatch.
        (
            ["-J", "x", "job.sh", "200", "--gpus=1", "-J", "y"],
            ["--job-name=x"],
            "job.sh",
            ["200", "--gpus=1", "-J", "y"],
        ),
        (["--exclusive", "job.sh", "a b"], ["--exclusive"], "job.sh", ["a b"]),
        (
            ["--nice", "--get-user-env", "-k", "job.sh"],
            ["--nice", "--get-user-env", "--no-kill"],
            "job.sh",
            [],
        ),
        (["--nice=5", "--exclusive=user", "job.sh"], ["--nice=5", "--exclusive=user"], "job.sh", []),
        (["--time", "5", "-", "x"], ["--time=5"], "-", ["x"]),
        (["--", "job.sh", "--", "-x"], [], "job.sh", ["--", "-x"]),
    ],
)
def test_the_words_after_the_job_file_are_the_scripts_arguments(
    argv: list[str], options: list[str], file: str, script_args: list[str]
) -> None:
    args = parsed(*argv)
    assert (sorted(sbatch.argv_of(args)), args.file, args.script_args) == (sorted(options), file, script_args)


def test_alloc_takes_exclusive_without_eating_its_command() -> None:
    from mtgpu.cli.job import alloc_args
    from mtgpu.cli.slurm import commands

    root = build_parser()
    args = alloc_args(
        root.parse_args(submit_argv(["alloc", "--exclusive", "--mem=1G", "sh", "-c", "x"], root))
    )
    assert (args.exclusive, args.mem, args.command) == ("", "1G", ["sh", "-c", "x"])
    seen = {}

    def fake(args, prog):
        seen.update(vars(args))
        return 0

    import mtgpu.cli.job as job

    orig, job.main_with = job.main_with, fake
    try:
        assert commands.salloc_main(["--exclusive", "-t", "5", "bash", "-l"]) == 0
    finally:
        job.main_with = orig
    assert (seen["exclusive"], seen["time"], seen["command"]) == ("", "5", ["bash", "-l"])


def run_sbatch(monkeypatch, argv, stdin_tty=False):
    """sbatch_main in-process up to the submission: the parsed arguments it would submit."""
    import mtgpu.cli.job as job
    from mtgpu.cli.slurm import commands

    seen: dict = {}

    def fake(args, prog):
        seen.update(vars(args))
        return 0

    class Stdin(io.StringIO):
        def isatty(self) -> bool:
            return stdin_tty

    monkeypatch.setattr(job, "main_with", fake)
    monkeypatch.setattr("sys.stdin", Stdin())
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = commands.sbatch_main(argv)
    return rc, seen, err.getvalue()


def test_sbatch_reads_the_script_from_stdin_unless_a_terminal_and_keeps_arguments(monkeypatch) -> None:
    rc, seen, _ = run_sbatch(monkeypatch, ["--parsable", "--exclusive"])
    assert rc == 0 and seen["file"] == "-" and seen["sbatch_exclusive"] == "" and seen["script_args"] == []
    rc, seen, _ = run_sbatch(monkeypatch, ["--exclusive", "job.sh", "200"])
    assert rc == 0 and (seen["file"], seen["script_args"], seen["banner"]) == (
        "job.sh",
        ["200"],
        "Submitted batch job",
    )
    rc, seen, err = run_sbatch(monkeypatch, ["--parsable"], stdin_tty=True)
    assert rc == 1 and not seen and err.count("\n") == 1 and "no batch script" in err
    rc, seen, err = run_sbatch(monkeypatch, ["--wrap", "echo hi", "extra"])
    assert rc == 1 and not seen and "Script arguments not permitted with --wrap" in err
    rc, seen, _ = run_sbatch(monkeypatch, ["--wrap=echo hi", "--nice"], stdin_tty=True)
    assert rc == 0 and seen["script_text"] == "#!/bin/sh\necho hi\n" and seen["sbatch_wrap"] is None


def test_the_daemon_takes_bounded_text_script_arguments() -> None:
    from mtgpu.api.jobs import MAX_SCRIPT_ARGS, MAX_SCRIPT_ARGS_BYTES, submit_script_args
    from mtgpu.errors import ValidationError

    assert submit_script_args({}) == [] and submit_script_args({"args": ["200", "a b"]}) == ["200", "a b"]
    for bad, said in (
        (["a\0b"], "NUL"),
        (["ok", "\udcff"], "$2"),
        ([1], "strings"),
        (["x"] * (MAX_SCRIPT_ARGS + 1), "strings"),
        (["x" * MAX_SCRIPT_ARGS_BYTES], "bytes"),
    ):
        with pytest.raises(ValidationError, match=re.escape(said)):
            submit_script_args({"args": bad})
