"""``sbatch``'s options: one table that ``#SBATCH`` lines and ``mt-job submit`` share.

Every option of Slurm's ``sbatch`` is in :data:`OPTIONS`, with what it does in MTGPU:

- ``set``: it sets a job file key (``--job-name`` is ``name``) or one of the keys only
  ``#SBATCH`` has (``--mem-per-cpu``), read by :mod:`mtgpu.schedd.jobfile`;
- ``warn``: it has no effect on an MTGPU cluster (``--partition``: there is one
  queue), so a job that names it runs as it would anyway, with a warning;
- ``refuse``: MTGPU cannot honour it, so the submission is refused with the reason,
  never run without it.

:func:`tokens` splits a line of options as ``sbatch`` reads them, :func:`add_arguments`
adds every option to an :mod:`argparse` parser (``mt-job submit``, and any ``sbatch``
front end), and :func:`argv_of` turns the parsed options back into the tokens the
daemon reads, so the command line and the file are read by the same code.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Option:
    """One ``sbatch`` option: its long name, short letter, whether it takes a value
    (``"?"``: optional, as ``--exclusive[=user]``), and what MTGPU does with it."""

    long: str
    short: str = ""
    value: bool | str = True
    kind: str = "set"  # set, flag, warn, refuse
    key: str = ""  # the key it sets (set, flag)
    const: str = ""  # the value a flag sets
    why: str = ""  # warn/refuse: the reason; set: the help text
    metavar: str = "VALUE"


_LATER = "not yet supported by MTGPU"
_NO_EFFECT = "has no effect on an MTGPU cluster"

OPTIONS: tuple[Option, ...] = (
    # What a job asks for.
    Option(
        "--job-name", "J", key="name", why="the job's name (default: the job file's name)", metavar="NAME"
    ),
    Option("--nodes", "N", key="nodes", why="members that run the job together (a range uses its minimum)"),
    Option("--ntasks", "n", key="ntasks", why="tasks in all: CPUs are tasks x --cpus-per-task"),
    Option("--ntasks-per-node", key="ntasks_per_node", why="tasks on each member"),
    Option("--cpus-per-task", "c", key="cpus_per_task", why="CPUs of each task"),
    Option("--cpus-per-gpu", key="cpus_per_gpu", why="CPUs of each GPU"),
    Option("--mincpus", key="mincpus", why="at least this many CPUs on each member"),
    Option("--mem", key="ram", why="RAM on each member; a bare number is megabytes"),
    Option("--mem-per-cpu", key="ram_per_cpu", why="RAM of each CPU; a bare number is megabytes"),
    Option("--mem-per-gpu", key="ram_per_gpu", why="RAM of each GPU; a bare number is megabytes"),
    Option("--gpus", "G", key="gpus_total", why="GPUs of the whole job, [TYPE:]N, split over the nodes"),
    Option("--gpus-per-node", key="gpus", why="GPUs on each member, [TYPE:]N"),
    Option("--gres", key="gres", why="gpu[:TYPE]:N, GPUs on each member"),
    Option("--time", "t", key="time", why="the time limit (MM, HH:MM:SS, D-HH:MM:SS, 2h)"),
    Option("--array", "a", key="array", why="an array: 0-9, 1,3,5, 0-99:3, %N caps those running"),
    Option("--nodelist", "w", key="server", why="run only on these members: gpu01,gpu[02-04]"),
    Option("--output", "o", key="output", why="standard output's file (%j %A %a %x %u %N)", metavar="PATH"),
    Option("--error", "e", key="error", why="standard error's file", metavar="PATH"),
    Option("--chdir", "D", key="workdir", why="the directory the job starts in", metavar="DIR"),
    Option(
        "--requeue", value=False, kind="flag", key="requeue", const="yes", why="requeue if its member is lost"
    ),
    Option("--no-requeue", value=False, kind="flag", key="requeue", const="no", why="never requeue"),
    Option("--priority", key="priority", why="0 to 100; above 50 takes an admin"),
    Option("--nice", value="?", key="nice", why="lower the job's priority by this much (default 100)"),
    Option("--container-image", key="container", why="run in this container image or template"),
    Option("--container", key="container", why="run in this container image or template"),
    # What MTGPU does not do yet: refused, never silently dropped.
    Option(
        "--dependency",
        "d",
        key="dependency",
        why="after/afterany/afterok/afternotok:ID[:ID], singleton; ',' all, '?' any",
    ),
    Option(
        "--hold",
        "H",
        value=False,
        kind="flag",
        key="hold",
        const="yes",
        why="submit held: `mt-job release ID` lets it start",
    ),
    Option("--begin", "b", key="begin", why="not before: now+1hour, 16:00, 2030-01-31T08:00"),
    Option(
        "--kill-on-invalid-dep",
        key="kill_on_invalid_dep",
        why="yes (default): end a job whose dependency can never be met; no: keep it pending",
    ),
    Option(
        "--test-only",
        value=False,
        kind="flag",
        key="test_only",
        const="yes",
        why="say when and where the job would start; submit nothing",
    ),
    Option(
        "--wait",
        "W",
        value=False,
        kind="flag",
        key="wait",
        const="yes",
        why="return when the job ends, with its exit status",
    ),
    Option("--constraint", "C", key="constraint", why="members with these NODE_FEATURES: a100&nvlink|h100"),
    Option("--exclude", "x", key="exclude", why="never run on these members: gpu01,gpu[02-04]"),
    Option(
        "--exclusive",
        value="?",
        key="exclusive",
        why="whole members, running no other job: all their CPUs; RAM and GPUs as asked",
    ),
    Option(
        "--export",
        key="export",
        why="ALL (default), NONE, or NAME[=VALUE],...: the variables the job takes from your shell",
    ),
    Option(
        "--open-mode", key="open_mode", why="truncate (default) or append: how the output files are opened"
    ),
    Option(
        "--signal",
        key="signal",
        why="[B:]SIG[@SECONDS]: send SIG this long (default 60 s) before the time limit",
    ),
    Option(
        "--propagate",
        value="?",
        kind="refuse",
        why="the submitting shell's limits are propagated as PROPAGATE_RESOURCE_LIMITS says",
    ),
    Option("--gpus-per-task", kind="refuse", why=_LATER + "; use --gpus-per-node"),
    Option("--gpus-per-socket", kind="refuse", why="MTGPU does not place by socket"),
    Option("--ntasks-per-gpu", kind="refuse", why=_LATER + "; use --ntasks-per-node"),
    Option("--ntasks-per-core", kind="refuse", why="MTGPU does not place by core"),
    Option("--ntasks-per-socket", kind="refuse", why="MTGPU does not place by socket"),
    Option("--sockets-per-node", kind="refuse", why="MTGPU does not place by socket"),
    Option("--cores-per-socket", kind="refuse", why="MTGPU does not place by socket"),
    Option("--threads-per-core", kind="refuse", why="MTGPU does not place by hardware thread"),
    Option("--extra-node-info", "B", kind="refuse", why="MTGPU does not place by socket, core or thread"),
    Option("--core-spec", "S", kind="refuse", why="MTGPU does not reserve system cores"),
    Option("--thread-spec", kind="refuse", why="MTGPU does not reserve system threads"),
    Option("--tmp", kind="refuse", why="MTGPU does not schedule by local disk space"),
    Option("--licenses", "L", kind="refuse", why="MTGPU has no licenses to schedule"),
    Option("--reservation", kind="refuse", why="MTGPU has no advance reservations"),
    Option("--clusters", "M", kind="refuse", why="a submission goes to the cluster you are logged in to"),
    Option(
        "--cluster-constraint", kind="refuse", why="a submission goes to the cluster you are logged in to"
    ),
    Option("--deadline", kind="refuse", why="MTGPU does not cancel jobs by a deadline; use --time"),
    Option("--input", "i", kind="refuse", why="a job's standard input is /dev/null"),
    Option("--nodefile", "F", kind="refuse", why=_LATER + "; use --nodelist"),
    Option(
        "--no-kill", "k", value="?", kind="refuse", why="a multi-node job always ends when one member is lost"
    ),
    Option("--gres-flags", kind="refuse", why="MTGPU does not bind GPUs to sockets"),
    Option("--gpu-freq", kind="refuse", why="MTGPU does not set GPU clocks"),
    Option("--batch", kind="refuse", why="MTGPU does not select members by batch host features"),
    Option("--bb", kind="refuse", why="MTGPU has no burst buffers"),
    Option("--bbf", kind="refuse", why="MTGPU has no burst buffers"),
    Option("--network", kind="refuse", why="MTGPU does not allocate network resources"),
    Option("--mcs-label", kind="refuse", why="MTGPU has no MCS labels"),
    Option("--uid", kind="refuse", why="a job runs as the tenant who submits it"),
    Option("--gid", kind="refuse", why="a job runs with its tenant's own group"),
    Option("--export-file", kind="refuse", why=_LATER + " (exported variables)"),
    Option("--tres-per-task", kind="refuse", why=_LATER + "; use --cpus-per-task and --gpus-per-node"),
    Option("--wrap", kind="refuse", why="give a job file (or - for standard input) instead"),
    Option("--switches", kind="refuse", why="MTGPU does not place by network switch"),
    Option("--reboot", value=False, kind="refuse", why="MTGPU does not reboot members for a job"),
    Option("--power", kind="refuse", why="MTGPU does not manage power"),
    Option("--cpu-freq", kind="refuse", why="MTGPU does not set CPU frequencies"),
    # No effect here: the job runs as it would without them, with a warning.
    Option(
        "--partition",
        "p",
        kind="warn",
        why=_NO_EFFECT + " (one queue per cluster; GPU type is chosen with --gres)",
    ),
    Option("--account", "A", kind="warn", why=_NO_EFFECT + " (usage is counted per tenant)"),
    Option("--qos", "q", kind="warn", why=_NO_EFFECT + " (there are no QOS levels; see --priority)"),
    Option("--mail-type", kind="warn", why=_NO_EFFECT + " (MTGPU sends no mail)"),
    Option("--mail-user", kind="warn", why=_NO_EFFECT + " (MTGPU sends no mail)"),
    Option("--comment", kind="warn", why=_NO_EFFECT + " (comments are not stored)"),
    Option("--wckey", kind="warn", why=_NO_EFFECT + " (there are no workload keys)"),
    Option("--acctg-freq", kind="warn", why=_NO_EFFECT + " (usage is sampled at USAGE_SAMPLE_INTERVAL)"),
    Option("--profile", kind="warn", why=_NO_EFFECT + " (there is no profiling plugin)"),
    Option("--time-min", kind="warn", why=_NO_EFFECT + " (the job gets its --time)"),
    Option(
        "--get-user-env", value="?", kind="warn", why=_NO_EFFECT + " (the job gets its own clean environment)"
    ),
    Option("--ignore-pbs", value=False, kind="warn", why=_NO_EFFECT + " (#PBS lines are never read)"),
    Option("--gpu-bind", kind="warn", why=_NO_EFFECT + " (the job sees exactly its own GPUs)"),
    Option("--mem-bind", kind="warn", why=_NO_EFFECT + " (memory is not bound to NUMA nodes)"),
    Option("--hint", kind="warn", why=_NO_EFFECT + " (the job is pinned to its reserved cores)"),
    Option("--distribution", "m", kind="warn", why=_NO_EFFECT + " (the script runs once on each member)"),
    Option("--contiguous", value=False, kind="warn", why=_NO_EFFECT + " (members are not ordered)"),
    Option("--spread-job", value=False, kind="warn", why=_NO_EFFECT + " (each member runs one part)"),
    Option("--use-min-nodes", value=False, kind="warn", why=_NO_EFFECT + " (a node range uses its minimum)"),
    Option(
        "--oversubscribe",
        "s",
        value=False,
        kind="warn",
        why=_NO_EFFECT + " (members are shared by their free resources)",
    ),
    Option(
        "--overcommit", "O", value=False, kind="warn", why=_NO_EFFECT + " (the job gets the CPUs it asks for)"
    ),
    Option("--wait-all-nodes", kind="warn", why=_NO_EFFECT + " (every member starts together)"),
    Option("--delay-boot", kind="warn", why=_NO_EFFECT + " (members are never rebooted)"),
    Option("--prefer", kind="warn", why=_NO_EFFECT + " (there are no node features to prefer)"),
    Option(
        "--parsable",
        value=False,
        kind="warn",
        why="takes effect on the command line only (mt-job submit --parsable)",
    ),
    Option("--quiet", "Q", value=False, kind="warn", why="takes effect on the command line only"),
    Option("--verbose", "v", value=False, kind="warn", why="takes effect on the command line only"),
)

#: Options by long name, and the long names of the short letters.
BY_LONG: dict[str, Option] = {o.long: o for o in OPTIONS}
SHORT: dict[str, str] = {f"-{o.short}": o.long for o in OPTIONS if o.short}


def resolve(opt: str) -> str:
    """``opt``'s long name: itself if known, else the one long option it abbreviates.
    sbatch reads ``#SBATCH`` lines with getopt_long, which takes any unambiguous
    prefix of a long option (``--err`` is ``--error``); an exact name always wins
    (``--gpus``, not ``--gpus-per-node``). An unknown or ambiguous prefix is kept as
    written, so that :func:`suggest` names the problem.

    >>> resolve("--err"), resolve("--gpus"), resolve("--cpus")
    ('--error', '--gpus', '--cpus')
    """
    if opt in BY_LONG or not opt.startswith("--") or len(opt) < 3:
        return opt
    matches = [long for long in BY_LONG if long.startswith(opt)]
    return matches[0] if len(matches) == 1 else opt


def suggest(opt: str) -> str:
    """The reason an unknown option is refused, with the closest known one.

    >>> suggest("--gress")
    'unknown option, did you mean --gres?'
    >>> suggest("--zzzzzz")
    'unknown option; `mt-job submit --help` lists the options'
    >>> suggest("--cpus")
    'ambiguous option: it abbreviates --cpus-per-task, --cpus-per-gpu; write one in full'
    """
    if opt.startswith("--") and len(opt) >= 3:
        matches = [long for long in BY_LONG if long.startswith(opt)]
        if len(matches) > 1:
            return f"ambiguous option: it abbreviates {', '.join(matches[:4])}; write one in full"
    close = difflib.get_close_matches(opt, list(BY_LONG), n=1, cutoff=0.75)
    return (
        f"unknown option, did you mean {close[0]}?"
        if close
        else ("unknown option; `mt-job submit --help` lists the options")
    )


def tokens(words: list[str]) -> list[tuple[str, str | None, str]]:
    """Split sbatch arguments into (long option, value, as written).

    ``-J x``, ``-Jx``, ``--job-name=x`` and ``--job-name x`` are the same; a word that
    is no option has an empty long name; an unknown option keeps the name written; an
    unambiguous prefix of a long option is that option, as in sbatch (:func:`resolve`).

    >>> tokens(["-Jx", "--mem", "4G", "--requeue", "-c", "2", "--err", "e.log"])
    [('--job-name', 'x', '-Jx'), ('--mem', '4G', '--mem 4G'), ('--requeue', None, '--requeue'), ('--cpus-per-task', '2', '-c 2'), ('--error', 'e.log', '--err e.log')]
    """
    out: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(words):
        tok = words[i]
        i += 1
        if not tok.startswith("-") or len(tok) < 2:
            out.append(("", tok, tok))
            continue
        if tok.startswith("--"):
            opt, eq, attached = tok.partition("=")
            opt = resolve(opt)
        else:
            opt, attached = SHORT.get(tok[:2], tok[:2]), tok[2:].removeprefix("=")
            eq = "=" if attached else ""
        o = BY_LONG.get(opt)
        if eq:
            out.append((opt, attached, tok))
        elif (o is None or o.value is True) and i < len(words) and not words[i].startswith("-"):
            out.append((opt, words[i], f"{tok} {words[i]}"))
            i += 1
        else:
            out.append((opt, None, tok))
    return out


def add_arguments(parser: argparse.ArgumentParser, skip: Iterable[str] = ()) -> None:
    """Add every ``sbatch`` option but those in ``skip`` to ``parser`` (dest
    ``sbatch_NAME``), each with its help: what it sets, or why it is refused or has no
    effect."""
    skipped = set(skip)
    for o in OPTIONS:
        if o.long in skipped:
            continue
        names = [o.long, *([f"-{o.short}"] if o.short else [])]
        dest = "sbatch_" + o.long[2:].replace("-", "_")
        note = {"refuse": "refused: ", "warn": "no effect: "}.get(o.kind, "")
        help_text = (note + o.why).replace("%", "%%")
        if o.value is False:
            parser.add_argument(*names, dest=dest, action="store_true", default=None, help=help_text)
        elif o.value == "?":
            parser.add_argument(
                *names, dest=dest, nargs="?", const="", default=None, metavar=o.metavar, help=help_text
            )
        else:
            parser.add_argument(*names, dest=dest, default=None, metavar=o.metavar, help=help_text)


def normalize_argv(argv: list[str]) -> list[str]:
    """Command-line words as :func:`add_arguments`'s parser must see them: an option
    whose value is optional (``--exclusive[=user]``) takes one only when attached, as
    in sbatch, so ``--exclusive job.sh`` does not read the job file as its value.

    >>> normalize_argv(["--exclusive", "job.sh", "--nice=5", "-k"])
    ['--exclusive=', 'job.sh', '--nice=5', '--no-kill=']
    """
    optional = {o.long for o in OPTIONS if o.value == "?"}
    out = []
    for a in argv:
        long = SHORT.get(a, a)
        out.append(f"{long}=" if long in optional else a)
    return out


def argv_of(args: argparse.Namespace) -> list[str]:
    """The options :func:`add_arguments` parsed, as ``--long=value`` tokens (in table order)."""
    out: list[str] = []
    for o in OPTIONS:
        v = getattr(args, "sbatch_" + o.long[2:].replace("-", "_"), None)
        if v is None or v is False:
            continue
        out.append(o.long if v is True or v == "" else f"{o.long}={v}")
    return out


def names(kind: str) -> Iterable[Option]:
    """The options of one kind (``warn``, ``refuse``...), for the manual's tables."""
    return (o for o in OPTIONS if o.kind == kind)
