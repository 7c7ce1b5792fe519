"""The installer never replaces or shadows a host's own Slurm commands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mtgpu.install.setup import slurm_installed


def test_a_hosts_own_sbatch_is_kept_and_mtgpus_link_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, bin_dir, other = tmp_path / "opt", tmp_path / "bin", tmp_path / "usr"
    for d in (prefix / "venv" / "bin", bin_dir, other):
        d.mkdir(parents=True)
    ours = prefix / "venv" / "bin" / "sbatch"
    ours.write_text("#!/bin/sh\n")
    ours.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    link = bin_dir / "sbatch"
    assert not slurm_installed("sbatch", link, prefix)  # nothing there yet
    link.symlink_to(ours)
    assert not slurm_installed("sbatch", link, prefix)  # MTGPU's own link
    link.unlink()
    link.write_text("#!/bin/sh\n")  # a Slurm installed in BIN_DIR itself
    link.chmod(0o755)
    assert slurm_installed("sbatch", link, prefix)
    link.unlink()
    slurm = other / "sbatch"  # Slurm elsewhere on PATH: a link in BIN_DIR would shadow it
    slurm.write_text("#!/bin/sh\n")
    slurm.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), str(other)]))
    assert slurm_installed("sbatch", link, prefix)


def test_a_kept_slurm_command_keeps_its_own_completion_and_manual_page(tmp_path: Path) -> None:
    """MTGPU's sbatch page and completion would come first in man's and bash's search
    (/usr/local/share before /usr/share) and replace a Slurm built into /usr/local."""
    from mtgpu.install.setup import install_shell_files

    prefix, share, profile = tmp_path / "opt", tmp_path / "share", tmp_path / "profile.d"
    theirs = share / "man" / "man1" / "sbatch.1"
    theirs.parent.mkdir(parents=True)
    theirs.write_text(".TH SBATCH 1 Slurm\n")
    install_shell_files(prefix, share, profile, keep={"sbatch"})
    assert theirs.read_text() == ".TH SBATCH 1 Slurm\n" and not theirs.is_symlink()
    assert not (share / "bash-completion" / "completions" / "sbatch").exists()
    assert not (share / "zsh" / "site-functions" / "_sbatch").exists()
    assert (share / "man" / "man1" / "squeue.1").is_symlink()
    script = (profile / "mtgpu-completion.sh").read_text()
    assert "completions/squeue" in script and "completions/sbatch" not in script
