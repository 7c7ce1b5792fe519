"""The WSL2 step of mtgpu-setup against a fake root: a temporary directory standing in
for /, with a WSL2 kernel release, Windows drives in its /proc/mounts, /mnt/c and
/mnt/d, an admin's own /etc/wsl.conf and NVIDIA's WSL library directory."""

from __future__ import annotations

import configparser
import os
import stat
from pathlib import Path

import pytest
import yaml

from mtgpu.install import setup

WSL2_RELEASE = "5.15.153.1-microsoft-standard-WSL2\n"
MOUNTS = (
    r"C:\134 /mnt/c 9p rw,noatime,dirsync,aname=drvfs;path=C:\134;uid=1000;gid=1000;"
    r"symlinkroot=/mnt/,mmap,access=client,msize=65536,trans=fd,rfd=5,wfd=5 0 0"
    "\n"
    r"D:\134 /mnt/d 9p rw,noatime,aname=drvfs;path=D:\134;uid=1000;gid=1000 0 0"
    "\n"
    "none /mnt/wsl tmpfs rw,relatime 0 0\n"
    "/dev/sdc / ext4 rw,relatime,discard 0 0\n"
)
ADMINS_CONF = """# my WSL settings
[network]
hostname = gpubox

[automount]
enabled = true
options = "metadata,umask=022"
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for d in ("proc/sys/kernel", "etc", "mnt/c", "mnt/d", "mnt/wsl", "usr/lib/wsl/lib", "etc/ld.so.conf.d"):
        (root / d).mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(WSL2_RELEASE)
    (root / "proc/mounts").write_text(MOUNTS)
    for d in ("mnt/c", "mnt/d"):
        os.chmod(root / d, 0o777)
    os.chmod(root / "mnt/wsl", 0o755)
    (root / "etc/wsl.conf").write_text(ADMINS_CONF)
    (root / "usr/lib/wsl/lib/libnvidia-ml.so.1").write_bytes(b"")
    (root / "etc/ld.so.conf.d/ld.wsl.conf").write_text("/usr/lib/wsl/lib\n")
    cfg = tmp_path / "mtgpu.yaml"
    cfg.write_text(yaml.safe_dump({"STATE_DIR": str(tmp_path / "state"), "RUN_DIR": str(tmp_path / "run")}))
    monkeypatch.setenv("MTGPU_HOST_ROOT", str(root))
    return root, cfg


def _wsl(cfg: Path, root: Path, *extra: str) -> int:
    return setup.main(
        [
            "wsl",
            "--config",
            str(cfg),
            "--bin-dir",
            "/usr/local/bin",
            "--unit-dir",
            str(root / "etc/systemd/system"),
            *extra,
        ]
    )


def _conf(root: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser()
    cp.read_string((root / "etc/wsl.conf").read_text())
    return cp


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_drives_locked_boot_command_written_and_admins_lines_kept(fake, capsys):
    root, cfg = fake
    assert _wsl(cfg, root) == 0
    out = capsys.readouterr().out
    conf = _conf(root)
    assert conf["automount"]["options"] == '"metadata,umask=077"'
    assert conf["automount"]["enabled"] == "true" and conf["network"]["hostname"] == "gpubox"
    assert conf["boot"]["command"] == f'"/usr/local/bin/mtgpu-setup start --config {cfg}"'
    assert "systemd" not in conf["boot"]
    text = (root / "etc/wsl.conf").read_text()
    assert text.startswith("# my WSL settings\n")
    assert (root / "etc/wsl.conf.mtgpu-orig").read_text() == ADMINS_CONF
    # The mounted drives are closed to everyone but their owner; /mnt/wsl is not a drive.
    assert _mode(root / "mnt/c") == 0o700 and _mode(root / "mnt/d") == 0o700
    assert _mode(root / "mnt/wsl") == 0o755
    assert "/mnt/c (C:\\): locked now" in out and "/mnt/d (D:\\): locked now" in out
    assert "to undo, drives: restore /etc/wsl.conf from /etc/wsl.conf.mtgpu-orig" in out
    assert "WSL_LOCK_DRIVES: false" in out
    assert "NVML works" in out and "WARNING" not in out

    # Again: nothing more to do, the file is left as it is.
    assert _wsl(cfg, root) == 0
    assert (root / "etc/wsl.conf").read_text() == text
    assert "already lock the drives" in capsys.readouterr().out


def test_systemd_boot_and_a_missing_nvidia_driver(fake, capsys):
    root, cfg = fake
    # Only /proc/version names the WSL2 kernel here; no wsl.conf yet; no NVIDIA library.
    (root / "proc/sys/kernel/osrelease").unlink()
    (root / "proc/version").write_text(f"Linux version {WSL2_RELEASE.strip()} (gcc 11.2.0) #1 SMP\n")
    (root / "etc/wsl.conf").unlink()
    (root / "usr/lib/wsl/lib/libnvidia-ml.so.1").unlink()
    (root / "usr/lib/wsl/lib").rmdir()
    assert _wsl(cfg, root, "--wsl-boot", "systemd") == 0
    out = capsys.readouterr().out
    conf = _conf(root)
    assert conf["boot"]["systemd"] == "true" and "command" not in conf["boot"]
    assert conf["automount"]["options"] == '"umask=077"'
    assert not (root / "etc/wsl.conf.mtgpu-orig").exists()
    wants = root / "etc/systemd/system/multi-user.target.wants/mtgpu.service"
    assert wants.is_symlink() and os.readlink(wants) == str(root / "etc/systemd/system/mtgpu.service")
    assert "wsl --shutdown" in out
    assert "to undo, drives: delete /etc/wsl.conf" in out
    assert "WARNING: NVIDIA: no /usr/lib/wsl/lib" in out

    # Once systemd runs (after WSL's restart), auto keeps to it.
    (root / "run/systemd/system").mkdir(parents=True)
    assert _wsl(cfg, root) == 0
    assert "mtgpu.service starts with it" in capsys.readouterr().out
    assert "command" not in _conf(root)["boot"]


def test_lock_can_be_turned_off_and_another_boot_command_is_kept(fake, capsys):
    root, cfg = fake
    cfg.write_text(cfg.read_text() + "WSL_LOCK_DRIVES: false\n")
    (root / "etc/wsl.conf").write_text(ADMINS_CONF + "\n[boot]\ncommand = service cron start\n")
    assert _wsl(cfg, root) == 0
    out = capsys.readouterr().out
    conf = _conf(root)
    assert conf["automount"]["options"] == '"metadata,umask=022"'
    assert conf["boot"]["command"] == "service cron start"
    assert _mode(root / "mnt/c") == 0o777
    assert "WSL_LOCK_DRIVES is false" in out
    assert "already has [boot] command" in out and "mtgpu-setup start" in out


def test_not_a_wsl_host(fake, capsys):
    root, cfg = fake
    (root / "proc/sys/kernel/osrelease").write_text("6.1.0-27-amd64\n")
    assert _wsl(cfg, root) == 1
    assert "not a WSL2 host" in capsys.readouterr().out
    assert (root / "etc/wsl.conf").read_text() == ADMINS_CONF
