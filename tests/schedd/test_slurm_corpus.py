"""The corpus of real public GPU batch scripts (tests/data/slurm-corpus): each, read
unchanged through MTGPU's job-file parser, asks for exactly what Slurm would give it
(tests/data/slurm-corpus/expectations.yaml, worked out from sbatch(1)), or is refused
with a reason naming the directive. tests/schedd/test_slurm_corpus_daemon.py submits
some of them to a real daemon and reads what their probe printed."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtgpu.config.units import parse_size
from mtgpu.errors import JobError
from mtgpu.schedd.jobfile import expand_array, parse_job_file
from mtgpu.schedd.types import DEFAULT_RAM, JobSpec

CORPUS = Path(__file__).resolve().parents[1] / "data" / "slurm-corpus"
NOT_SCRIPTS = {"README.md", "expectations.yaml", "licenses"}
SCRIPTS = sorted(p.name for p in CORPUS.iterdir() if p.is_file() and p.name not in NOT_SCRIPTS)
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((CORPUS / "expectations.yaml").read_text())
SUBMIT_DIR = "/home/sue/project"


def parse(name: str, text: str | None = None) -> JobSpec:
    """``name`` read as sbatch would read it when submitted from SUBMIT_DIR."""
    if text is None:
        text = (CORPUS / name).read_text()
    return parse_job_file(text, default_workdir=SUBMIT_DIR, default_name=name)


def warned(spec: JobSpec) -> list[str]:
    """The options each warning says had no effect, in order."""
    return [m.group(1) for w in spec.warnings if (m := re.search(r": (--[a-z-]+) is ignored: ", w))]


def check(spec: JobSpec, exp: dict[str, Any], *, cpus: bool = True) -> None:
    """``spec`` asks for what ``exp`` says Slurm gives (see expectations.yaml)."""
    r = spec.request
    assert r.nodes == exp["nodes"]
    assert r.gpus == exp["gpus_per_node"]
    assert (r.gpu_type or r.gpu_brand) == exp.get("gpu_type")
    assert spec.ntasks == exp.get("ntasks")
    if cpus:
        assert r.cpus == exp["cpus_per_node"]
    mem = exp.get("mem_per_node")
    assert r.ram == (parse_size(mem) if mem else DEFAULT_RAM)
    assert spec.time_limit == exp.get("time")
    assert spec.array == exp.get("array")
    if "array_tasks" in exp:
        assert len(expand_array(spec)) == exp["array_tasks"]
    assert spec.name == exp["name"]
    assert (spec.output, spec.error) == (exp.get("output"), exp.get("error"))
    assert spec.workdir == posixpath.normpath(posixpath.join(SUBMIT_DIR, exp.get("workdir", ".")))
    assert r.constraint == exp.get("constraint")
    assert r.exclude == tuple(exp.get("exclude", ()))
    assert spec.requeue == exp.get("requeue", False)
    assert warned(spec) == exp.get("warned", [])
    assert len(spec.warnings) == len(warned(spec)), spec.warnings  # no other warning


def test_the_corpus_holds_thirty_scripts_each_with_its_expectation_and_source() -> None:
    assert len(SCRIPTS) >= 30
    assert set(SCRIPTS) == set(EXPECTED)
    readme = (CORPUS / "README.md").read_text()
    for name in SCRIPTS:
        assert f"| `{name}` |" in readme, f"{name} has no row in the README's sources table"
        text = (CORPUS / name).read_text()
        assert text.startswith("#!") and "# ---- MTGPU's corpus probe" in text, name


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_corpus_script_asks_for_what_slurm_gives_or_is_refused_naming_the_directive(name: str) -> None:
    exp = EXPECTED[name]
    if "refused" in exp:
        with pytest.raises(JobError) as err:
            parse(name)
        said = str(err.value)
        assert f"#SBATCH {exp['refused']}" in said and f"{exp['refused']} is refused: " in said, said
        assert "remove it to submit" in said, said
        return
    if exp.get("exclusive"):
        # Slurm gives an --exclusive job whole nodes: MTGPU whole members.
        spec = parse(name)
        assert spec.request.whole_member, "an --exclusive job placed as a shared one"
        check(spec, exp, cpus=False)  # every CPU of the node, however many it has
        return
    check(parse(name), exp)
