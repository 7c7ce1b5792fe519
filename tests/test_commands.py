"""Every program's command line, found from ``[project.scripts]`` (tests/README.md has
the contract): help written for its user with examples, one ``--version``, and the
shell completion and manual pages made from the same parsers, checked with a real
bash, zsh and man."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu.cmdline import (
    VERSION,
    bash_completion,
    man_page,
    options,
    parsers,
    profile_script,
    shell_files,
    subcommands,
    walk,
    zsh_completion,
)
from mtgpu.scripts import INTERNAL, console_scripts, linked_scripts

PROGRAMS = parsers()
BIN = Path(sys.executable).parent

#: What a user's help must never show: argparse's hidden marker, reStructuredText and
#: doctest markup from module docstrings, and the package's module paths.
LEAKS = re.compile(
    r"==SUPPRESS==|``|:(?:mod|func|class|data|meth):|>>>|"
    r"\bmtgpu\.(?:cli|api|schedd|gateway|workspaces|tmux|config|sshd|install|tui|accounts|state|cluster)\b"
)


def test_every_program_people_type_keeps_the_contract() -> None:
    """A program added to pyproject.toml is found here without a change to this file."""
    assert sorted(PROGRAMS) == sorted(name for name in console_scripts() if name not in INTERNAL)
    assert set(linked_scripts()) <= set(PROGRAMS)
    for name, parser in PROGRAMS.items():
        assert parser.prog == name, f"{name}'s build_parser() names it {parser.prog!r}"


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_every_help_is_written_for_its_user_with_an_example(
    program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    for path, parser in walk(PROGRAMS[program]):
        command = " ".join((program, *path))
        text = parser.format_help()
        leak = LEAKS.search(text)
        assert leak is None, f"`{command} --help` shows {leak.group()!r}:\n{text}"
        assert parser.description, f"`{command} --help` says nothing of what it does"
        assert "examples:" in text, f"`{command} --help` has no example"
        shown = text.split("examples:", 1)[1]
        assert command in shown, f"`{command} --help`'s examples do not run {command}"


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_each_program_prints_that_help_and_the_one_version(
    program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed program itself, not only its parser (mt-podman once printed its
    module's docstring)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("MTGPU_CONFIG", raising=False)
    env = dict(os.environ)
    helped = subprocess.run(
        [str(BIN / program), "--help"], capture_output=True, text=True, env=env, timeout=60, cwd="/"
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout == PROGRAMS[program].format_help()
    version = subprocess.run(
        [str(BIN / program), "--version"], capture_output=True, text=True, env=env, timeout=60, cwd="/"
    )
    # The Slurm commands name the Slurm release they follow first, for scripts that
    # check it; every other program prints the one version line.
    from mtgpu.cli.slurm.formats import version_line

    slurm = program in ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "salloc", "srun", "sacct")
    assert (version.returncode, version.stdout) == (0, (version_line() if slurm else VERSION) + "\n"), (
        version.stderr
    )


REPO = Path(__file__).resolve().parent.parent
#: The server, the laptop client, and a tenant's command that reaches asyncssh.
QUIET = ("mtgpu-server", "remotegpu-cli", "mt-job", "mtgpu-admin")


@pytest.mark.parametrize("program", QUIET)
def test_version_is_one_line_and_nothing_on_stderr(program: str) -> None:
    """This tree's entry point, as the installed script calls it: asyncssh with a newer
    cryptography printed 15 lines of CryptographyDeprecationWarning before the version."""
    module, func = console_scripts()[program].split(":")
    code = f"import sys; sys.argv[0] = {program!r}; from {module} import {func} as f; sys.exit(f())"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MTGPU_"))}
    r = subprocess.run(
        [sys.executable, "-c", code, "--version"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=60,
        cwd="/",
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, VERSION + "\n", "")


def test_the_walk_leaves_out_what_is_hidden() -> None:
    setup = PROGRAMS["mtgpu-setup"]
    assert "unpublish" not in subcommands(setup)  # uninstall's own second half
    assert "--stage2" not in options(next(p for path, p in walk(setup) if path == ("install",)))
    assert "==SUPPRESS==" not in setup.format_help()


# ------------------------------------------------------------ completion


def _complete(shell_script: str, words: list[str], *, shell: str = "bash") -> list[str]:
    """What ``shell`` offers for the last of ``words`` after loading ``shell_script``."""
    func = next(m for m in re.findall(r"complete -F (\S+) ", shell_script))
    array = " ".join(f"'{w}'" for w in words)
    call = f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; {func}; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    if shell == "bash":
        argv = ["bash", "--norc", "--noprofile", "-c", shell_script + "\n" + call]
    else:
        # zsh runs the bash function as its bash compatibility does: with sh's options.
        argv = ["zsh", "-f", "-c", shell_script + "\nemulate sh -c " + _sh_quote(call)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_bash_completes_subcommands_and_options_of_every_program() -> None:
    for program, parser in PROGRAMS.items():
        script = bash_completion(program, parser)
        for path, sub in walk(parser):
            offered = _complete(script, [program, *path, ""])
            assert set(subcommands(sub)) <= set(offered), (program, path, offered)
            if not subcommands(sub):
                dashed = _complete(script, [program, *path, "--"])
                assert {o for o in options(sub) if o.startswith("--")} == set(dashed), (program, path)


def test_bash_completes_a_prefix_at_depth() -> None:
    script = bash_completion("mtgpu-admin", PROGRAMS["mtgpu-admin"])
    assert _complete(script, ["mtgpu-admin", "us"]) == ["user", "usage"]
    assert _complete(script, ["mtgpu-admin", "user", "k"]) == ["key"]
    assert _complete(script, ["mtgpu-admin", "--json", "user", "key", "a"]) == ["add"]
    assert _complete(script, ["mtgpu-admin", "drain", "--r"]) == ["--reason"]
    assert _complete(script, ["mt-job", "--x"]) == []


def test_zsh_completes_through_the_same_function() -> None:
    text = zsh_completion("mt-job", PROGRAMS["mt-job"])
    assert text.startswith("#compdef mt-job\n")
    body = text.split("\n", 2)[2].rsplit("\n", 2)[0]  # without #compdef and the final call
    # zsh matches the typed prefix itself (outside a completion, bashcompinit's
    # compgen filters nothing), so the words are those of the subcommand typed.
    parser = PROGRAMS["mt-job"]
    logs = next(p for path, p in walk(parser) if path == ("logs",))
    assert set(_complete(body, ["mt-job", ""], shell="zsh")) == set(subcommands(parser) + options(parser))
    assert set(_complete(body, ["mt-job", "logs", "--f"], shell="zsh")) == set(options(logs))
    assert "--follow" in options(logs) and "submit" not in options(logs)


def test_the_login_profile_loads_completion_in_interactive_bash(tmp_path: Path) -> None:
    """What a tenant's terminal (an interactive login shell) gets from /etc/profile.d."""
    for rel, text in shell_files(PROGRAMS).items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    profile = tmp_path / "mtgpu-completion.sh"
    profile.write_text(profile_script(str(tmp_path), sorted(PROGRAMS)))
    for interactive, expect in ((["-i"], 0), ([], 1)):
        r = subprocess.run(
            ["bash", "--norc", "--noprofile", *interactive, "-c", f". {profile}; complete -p mt-job"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == expect, r.stderr
        if expect == 0:
            assert r.stdout.strip() == "complete -F _mtgpu_mt_job mt-job"


# ------------------------------------------------------------ manual pages


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_each_manual_page_renders_with_man(program: str, tmp_path: Path) -> None:
    page = man_page(program, PROGRAMS[program])
    path = tmp_path / f"{program}.{page.section}"
    path.write_text(page.text)
    r = subprocess.run(
        ["man", "--warnings", "-l", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0", "MANPAGER": "cat"},
        timeout=60,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = re.sub(r".\x08", "", r.stdout)  # no bold or underline
    assert text.startswith(f"{program.upper()}({page.section})")
    for path_, sub in walk(PROGRAMS[program]):
        heading = " ".join(path_).upper() if path_ else "SYNOPSIS"
        assert f"\n{heading}\n" in text, heading
        for line in (sub.epilog or "").splitlines()[1:]:
            assert " ".join(line.split()) in " ".join(text.split()), line
        for action in sub._actions:
            if action.help not in (None, argparse.SUPPRESS) and action.option_strings:
                assert action.option_strings[0] in text, (heading, action.option_strings)
