"""What every MTGPU program's command line shares: ``--version``, help with examples,
and the shell completion and manual pages made from the same argument parsers.

The contract each program keeps (tests/README.md): the module of its entry point in
``[project.scripts]`` has ``build_parser()`` returning its ``argparse`` parser, with
``prog`` set to the program's name (a module behind several programs takes the name:
``build_parser(prog)``), and ``main()`` parses with it. :func:`parser_of` finds it, so
a new program is covered by the help test, completion and manual pages when its
entry is added to pyproject.toml.

This imports nothing of MTGPU but the version and the list of programs, so any
program may use it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from mtgpu import __version__

#: What ``--version`` prints, the same for every program (and ``mtgpu-setup status``).
VERSION = f"mtgpu {__version__}"


def add_version(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` the ``--version`` every MTGPU program has."""
    parser.add_argument("--version", action="version", version=VERSION, help="print the version and exit")


def with_examples(parser: argparse.ArgumentParser, examples: Mapping[str, str]) -> argparse.ArgumentParser:
    """Put ``examples`` (keyed by the subcommand path, ``""`` for the program itself,
    ``"user add"`` for a nested one) at the end of each parser's help, and give the
    program ``--version``. Returns ``parser``."""
    if not any("--version" in a.option_strings for a in parser._actions):
        add_version(parser)
    _describe(parser)
    for path, sub in walk(parser):
        text = examples.get(" ".join(path))
        if text is None:
            continue
        lines = [line for line in text.strip().splitlines()]
        sub.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Start each subcommand's own --help with its line in its parent's list."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                if sub.description is None and choice.help:
                    sub.description = choice.help[0].upper() + choice.help[1:] + "."
                _describe(sub)


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser under it, with its path of subcommand
    names; subcommands whose help is hidden (``argparse.SUPPRESS``) are left out."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            shown = {a.dest for a in action._choices_actions}
            for name, sub in action.choices.items():
                if name in shown:
                    yield from walk(sub, (*path, name))


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """The names of ``parser``'s visible subcommands."""
    return [p[-1] for p, _ in walk(parser) if len(p) == 1]


def options(parser: argparse.ArgumentParser) -> list[str]:
    """``parser``'s visible option strings (``--json``, ``-f``...)."""
    out: list[str] = []
    for action in parser._actions:
        if action.help != argparse.SUPPRESS:
            out.extend(action.option_strings)
    return out


def parser_of(script: str, entry: str) -> argparse.ArgumentParser:
    """The parser of the program ``script`` whose entry point is ``entry`` (``module:function``)."""
    module = importlib.import_module(entry.partition(":")[0])
    build = getattr(module, "build_parser", None)
    if build is None:
        raise LookupError(f"{entry.partition(':')[0]} has no build_parser() for {script}")
    return build(script) if inspect.signature(build).parameters else build()


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of every program people type, by name, from ``[project.scripts]``
    (all but :data:`mtgpu.scripts.INTERNAL`: podman's hook and the ``docker`` shim)."""
    from mtgpu.scripts import INTERNAL, console_scripts

    table = console_scripts()
    return {name: parser_of(name, table[name]) for name in sorted(table) if name not in INTERNAL}


# ------------------------------------------------------------ completion


def _words(parser: argparse.ArgumentParser) -> str:
    return " ".join(subcommands(parser) + options(parser))


def _func(prog: str) -> str:
    return "_mtgpu_" + re.sub(r"[^A-Za-z0-9]", "_", prog)


def bash_completion(prog: str, parser: argparse.ArgumentParser) -> str:
    """A bash completion script for ``prog``: its subcommands (at any depth) and the
    options of the subcommand typed so far. Also read by zsh (``bashcompinit``)."""
    cases = []
    for path, sub in walk(parser):
        key = shlex.quote(" ".join(path)) if path else '""'
        cases.append(f"        {key}) words={shlex.quote(_words(sub))} ;;")
    name = _func(prog)
    return f"""# bash completion for {prog} ({VERSION}); made from its argument parser.
{name}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} path="" try words="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        [[ ${{COMP_WORDS[i]}} == -* ]] && continue
        try=${{path:+$path }}${{COMP_WORDS[i]}}
        {name}_known "$try" && path=$try
    done
    case "$path" in
{chr(10).join(cases)}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    [[ ${{#COMPREPLY[@]}} -eq 0 && $cur != -* ]] && COMPREPLY=($(compgen -f -- "$cur"))
    return 0
}}
{name}_known() {{
    case "$1" in
{chr(10).join(f"        {shlex.quote(' '.join(p))}) return 0 ;;" for p, _ in walk(parser) if p)}
    esac
    return 1
}}
complete -F {name} {prog}
"""


def zsh_completion(prog: str, parser: argparse.ArgumentParser) -> str:
    """A zsh completion file for ``prog`` (``#compdef``), by zsh's bash compatibility."""
    return (
        f"#compdef {prog}\n# zsh completion for {prog} ({VERSION}); made from its argument parser.\n"
        "autoload -U +X bashcompinit && bashcompinit\n"
        + bash_completion(prog, parser)
        + f'{_func(prog)} "$@"\n'
    )


# ------------------------------------------------------------ manual pages


def _roff(text: str) -> str:
    """``text`` safe in a roff body: backslashes and a leading dot or quote escaped."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line[:1] in (".", "'") else line for line in text.splitlines())


@dataclass(frozen=True)
class ManPage:
    """One program's manual page, section 1 (or 8 for an administrator's)."""

    name: str
    section: int
    text: str


#: Programs for the administrator of a host: their pages go in section 8.
ADMIN_PROGRAMS = frozenset({"mtgpu-server", "mtgpu-setup", "mtgpu-admin", "mtcode-admin"})


def man_page(prog: str, parser: argparse.ArgumentParser, date: datetime.date | None = None) -> ManPage:
    """The manual page of ``prog``: its help and every subcommand's, with examples."""
    section = 8 if prog in ADMIN_PROGRAMS else 1
    day = (date or datetime.date.today()).isoformat()
    summary = (parser.description or "").strip().splitlines()[0] if parser.description else prog
    out = [
        f'.TH {prog.upper()} {section} "{day}" "{VERSION}" "MTGPU"',
        ".SH NAME",
        f"{_roff(prog)} \\- {_roff(summary)}",
    ]
    for path, sub in walk(parser):
        heading = "SYNOPSIS" if not path else " ".join(path).upper()
        out.append(f".SH {_roff(heading)}")
        fmt = sub._get_formatter()
        fmt.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups, prefix="")
        out += [".nf", _roff(fmt.format_help().strip()), ".fi"]
        if sub.description and (path or sub.description.strip() != summary):
            out += [".PP", _roff(sub.description.strip())]
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            metavar = action.metavar if isinstance(action.metavar, str) else None
            names = ", ".join(action.option_strings) or (metavar or action.dest)
            if action.option_strings and action.nargs != 0:
                names += f" {metavar or action.dest.upper()}"
            help_text = (action.help or "").replace("%(default)s", str(action.default))
            out += [".TP", f"\\fB{_roff(str(names))}\\fR", _roff(help_text)]
        if sub.epilog:
            out += [".PP", ".nf", _roff(sub.epilog.strip()), ".fi"]
    out += [".SH SEE ALSO", "The MTGPU manual (docs/manual.md)."]
    return ManPage(prog, section, "\n".join(out) + "\n")


# ------------------------------------------------------------ installed files


def shell_files(programs: Mapping[str, argparse.ArgumentParser]) -> dict[str, str]:
    """Every completion script and manual page of ``programs``, by path under a
    ``share`` directory (``bash-completion/completions/NAME``,
    ``zsh/site-functions/_NAME``, ``man/man1/NAME.1``)."""
    out: dict[str, str] = {}
    for prog, parser in sorted(programs.items()):
        out[f"bash-completion/completions/{prog}"] = bash_completion(prog, parser)
        out[f"zsh/site-functions/_{prog}"] = zsh_completion(prog, parser)
        page = man_page(prog, parser)
        out[f"man/man{page.section}/{prog}.{page.section}"] = page.text
    return out


def profile_script(share: str, programs: list[str]) -> str:
    """``/etc/profile.d/mtgpu-completion.sh``: loads the bash completions in every
    interactive login shell (tenants' terminals are), also where the bash-completion
    package is not installed; one it already loaded is left as it is."""
    lines = [
        f"# Completion of MTGPU's commands ({VERSION}) in interactive bash; written by mtgpu-setup install.",
        'if [ -n "${BASH_VERSION:-}" ] && [ -n "${PS1:-}" ]; then',
    ]
    for prog in sorted(programs):
        path = shlex.quote(f"{share}/bash-completion/completions/{prog}")
        lines.append(f"    complete -p {prog} >/dev/null 2>&1 || {{ [ -r {path} ] && . {path}; }}")
    lines.append("fi")
    return "\n".join(lines) + "\n"
