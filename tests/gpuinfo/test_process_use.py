"""Per-process VRAM readings at the NVML and amdsmi boundary, through the sampler's
``process_use`` (keyed by GPU UUID) to the watchdog's per-job sums and decisions.

Recorded values:
- XuehaiPan/nvitop#152, nvidia-smi's process table: PID 10734 (C) holds 160MiB on
  GPU 0 and 160MiB on GPU 1; PID 58661 (G) 3MiB on GPU 0.
- NVIDIA H200 with PID 1117159 holding 130200MiB (see test_nvidia.H200).
- ROCm/ROC-smi#60, ``rocm-smi --showpids``: PID 1168514 (pt_main_thread) on GPU 1,
  VRAM USED 177386942464 bytes (an MI300X-class card, amdsmi's ``vram_mem``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pynvml

sys.path.insert(0, str(Path(__file__).parent))  # the recorded cards and NVML/amdsmi fixtures
from test_amd import MI300X, amdsmi  # noqa: F401 - the fixture
from test_nvidia import H100, H200, nvml  # noqa: F401 - the fixture

from mtgpu.config import Options
from mtgpu.gpuinfo.amd import AmdProbe
from mtgpu.gpuinfo.nvidia import NvidiaProbe
from mtgpu.gpuinfo.sampler import Sampler
from mtgpu.schedd.vramwatch import JobShare, job_use, judge

MiB = 1 << 20
G = 1 << 30


def _sampler(probe):
    return Sampler(Options(server_name="n1", tenant_home_root="/"), [probe])


def test_nvidia_processes_per_gpu_keyed_by_uuid(nvml, mocker, tmp_path):  # noqa: F811
    import dataclasses

    a, b = (dataclasses.replace(c, procs=[(10734, 160 * MiB)]) for c in H100)
    nvml["cards"] = [a, b]

    def graphics(h):
        if h[1] != 0:
            return []
        p = pynvml.nvmlStructToFriendlyObject(
            pynvml.c_nvmlProcessInfo_v3_t(
                pid=58661, usedGpuMemory=3 * MiB, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
        )
        return [p]

    mocker.patch.object(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", side_effect=graphics)
    use = _sampler(NvidiaProbe(proc_root=str(tmp_path))).process_use()
    assert set(use) == {a.uuid, b.uuid}
    assert [(p.pid, p.used_memory) for p in use[a.uuid].processes] == [(10734, 160 * MiB), (58661, 3 * MiB)]
    assert [(p.pid, p.used_memory) for p in use[b.uuid].processes] == [(10734, 160 * MiB)]
    # One job holding PID 10734 on both cards: its use is summed per GPU, not per job.
    per_job, outside = job_use(use.values(), {10734: "5"}.get)
    assert per_job == {("5", 0): 160 * MiB, ("5", 1): 160 * MiB}
    assert outside == {0: 3 * MiB, 1: 0}


def test_h200_process_over_a_shared_share_is_stopped_with_the_reason(nvml, tmp_path):  # noqa: F811
    nvml["cards"] = [H200]
    use = _sampler(NvidiaProbe(proc_root=str(tmp_path))).process_use()
    g = use[H200.uuid]
    per_job, _ = job_use(use.values(), {1117159: "12"}.get)
    stops = judge({g.index: g}, per_job, [JobShare("12", 0, "shared", 80 * G, (0,))], 5)
    assert [s.reason for s in stops] == ["used 127.1G of GPU 0's memory, over its vram=80G"]
    # The same reading is within a 128G share.
    assert judge({g.index: g}, per_job, [JobShare("12", 0, "shared", 128 * G, (0,))], 5) == []


def test_amd_process_list_keyed_by_uuid(amdsmi, tmp_path):  # noqa: F811
    import dataclasses

    card = dataclasses.replace(
        MI300X,
        procs=[
            {
                "name": "pt_main_thread",
                "pid": 1168514,
                "mem": 177386942464,
                "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 177386942464},
            }
        ],
    )
    amdsmi([card])
    use = _sampler(AmdProbe(proc_root=str(tmp_path))).process_use()
    assert [(p.pid, p.used_memory) for p in use[MI300X.uuid].processes] == [(1168514, 177386942464)]
    per_job, outside = job_use(use.values(), lambda pid: None)
    assert per_job == {} and outside == {0: 177386942464}  # no job's: outside use
