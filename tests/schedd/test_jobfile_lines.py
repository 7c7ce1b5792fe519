"""One definition of a line for directives and the shell (mtgpu/schedd/jobfile.py):
bash ends a line at a newline only, so a directive counts only where the shell sees
a line of its own. A carriage return inside a line is part of that line."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mtgpu.schedd.jobfile import parse_job_file


def _spec(text: str):
    return parse_job_file(text, default_workdir="/home/ann", default_name="job")


def test_bare_carriage_returns_do_not_make_directive_lines() -> None:
    # The shell sees one line: the shebang, a comment to its end. No directive.
    spec = _spec("#!/bin/bash\r#SBATCH --gpus=2\r#MTGPU name=cr\recho hi\r")
    assert spec.request.gpus == 0 and spec.name == "job"


def test_a_carriage_return_hides_no_directive_in_a_comment_line() -> None:
    text = "#!/bin/bash\n# notes\r#SBATCH --gpus=4\r#MTGPU name=hidden\n#SBATCH -J seen\ntrue\n"
    spec = _spec(text)
    assert spec.request.gpus == 0 and spec.name == "seen"


def test_a_carriage_return_after_a_command_ends_no_line() -> None:
    # `true\r#SBATCH ...` is a command line (the shell runs `true\r`): directives ended.
    spec = _spec("#!/bin/sh\n#SBATCH -J first\ntrue\r#SBATCH --gpus=3\n")
    assert spec.request.gpus == 0 and spec.name == "first"


@pytest.mark.parametrize("sep", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_other_line_breaks_of_python_are_not_lines_either(sep: str) -> None:
    spec = _spec(f"#!/bin/sh\n# x{sep}#SBATCH --gpus=2\ntrue\n")
    assert spec.request.gpus == 0


def test_crlf_files_keep_their_directives() -> None:
    spec = _spec("#!/bin/bash\r\n#SBATCH -J crlf\r\n#MTGPU gpus=1\r\necho hi\r\n")
    assert spec.name == "crlf" and spec.request.gpus == 1


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_shell_agrees_it_is_one_line(tmp_path) -> None:
    script = tmp_path / "job.sh"
    script.write_bytes(b"#!/bin/bash\n# note\r#SBATCH --gpus=4\recho hidden\necho seen\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
    assert out == "seen\n"
    assert _spec(script.read_bytes().decode()).request.gpus == 0
