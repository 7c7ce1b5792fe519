"""`mtgpu-setup gpu-check` against configured probe commands (real scripts)."""

from __future__ import annotations

import subprocess
import sys

import yaml
from mtgpu_testing import python_env

GOOD = r"""#!/bin/sh
# Two accelerators; honours ACME_VISIBLE_DEVICES like a real runtime would.
vis="${ACME_VISIBLE_DEVICES-0,1}"
out=""
for i in $(echo "$vis" | tr ',' ' '); do
  [ -n "$out" ] && out="$out,"
  out="$out{\"index\": $i, \"name\": \"Acme X1\", \"uuid\": \"acme-$i\", \"vram_total\": 17179869184, \"vram_used\": 0}"
done
echo "{\"gpus\": [$out]}"
"""


def _check(tmp_path, script: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe.sh"
    probe.write_text(script)
    probe.chmod(0o755)
    cfg = tmp_path / "mtgpu.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "GPU_PROBES": [
                    {"brand": "acme", "command": [str(probe)], "visibility_env": "ACME_VISIBLE_DEVICES"}
                ]
            }
        )
    )
    return subprocess.run(
        [sys.executable, "-m", "mtgpu.install.setup", "gpu-check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=120,
    )


def test_gpu_check_reports_a_working_probe(tmp_path):
    r = _check(tmp_path, GOOD)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "acme" in r.stdout and "Acme X1" in r.stdout


def test_gpu_check_names_what_is_wrong_with_garbage(tmp_path):
    r = _check(tmp_path, "#!/bin/sh\necho 'this is not json'\n")
    assert r.returncode == 1
    assert "acme" in r.stdout and "JSON" in r.stdout
