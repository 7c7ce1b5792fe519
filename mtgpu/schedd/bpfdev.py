"""The GPU wall on cgroup v2: a ``BPF_CGROUP_DEVICE`` program on a job's or a session's cgroup.

cgroup v2 has no ``devices`` controller: the kernel asks the device programs attached
to a process's cgroup and its ancestors at each ``open()`` and ``mknod()`` of a device
file, and refuses (EPERM) unless every one of them answers 1. This is what systemd's
``DevicePolicy=``/``DeviceAllow=`` and Slurm's cgroup/v2 plugin attach. The program
made here refuses character devices of the GPU majors (:func:`gpu_majors`: NVIDIA's,
DRM's and the dynamic ones in ``/proc/devices``) except the ``(major, minor)`` pairs a
job holds, and lets every other device through: the wall is about GPUs, the rest of
``/dev`` stays as the host's permissions have it.

The program is a dozen instructions, assembled by :func:`assemble` and loaded with the
``bpf(2)`` system call; ``tests/schedd/test_bpfdev.py`` runs it in a real cgroup on
this kernel (an open of a refused node fails with EPERM, an allowed one reaches the
driver). It is attached with ``BPF_F_ALLOW_MULTI``: programs a parent has (systemd's,
for one) still apply, since the kernel needs every one to allow. The cgroup holds the
program once attached; it goes when the cgroup is removed, so nothing is pinned.

The layout of ``struct bpf_cgroup_dev_ctx`` and of ``union bpf_attr``'s first fields
are the kernel's stable ABI (include/uapi/linux/bpf.h).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct
from collections.abc import Iterable

#: bpf(2) commands, program and attach types, flags (include/uapi/linux/bpf.h).
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
#: ``bpf_cgroup_dev_ctx.access_type``'s low half: a character device.
BPF_DEVCG_DEV_CHAR = 2
#: bpf(2)'s number on the architectures MTGPU runs on.
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361}

_libc = ctypes.CDLL(None, use_errno=True)

# One eBPF instruction: opcode, dst and src registers, 16-bit offset, 32-bit immediate.
_LDX_W = 0x61  # dst = *(u32 *)(src + off)
_AND_K = 0x57  # dst &= imm (64-bit)
_JNE_K = 0x55  # if dst != imm: pc += off
_JEQ_K = 0x15  # if dst == imm: pc += off
_JA = 0x05  # pc += off
_MOV_K = 0xB7  # dst = imm (64-bit)
_EXIT = 0x95


class BpfUnavailable(OSError):
    """The kernel refused to load or attach the program (no CONFIG_CGROUP_BPF, no
    privilege, a parent that allows no overriding program)."""


def _insn(op: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)


def assemble(allowed: Iterable[tuple[int, int]], majors: Iterable[int]) -> bytes:
    """The program: 0 (refuse) for a character device of a major in ``majors`` unless
    its ``(major, minor)`` is in ``allowed``; 1 (allow) for everything else."""
    deny = sorted(set(majors))
    allow = sorted(dev for dev in set(allowed) if dev[0] in deny)
    if not deny:  # nothing to refuse (the verifier refuses code it cannot reach)
        return _insn(_MOV_K, 0, 0, 0, 1) + _insn(_EXIT)
    # Jumps are assembled with labels and resolved once the layout is known.
    code: list[tuple[int, int, int, str | int, int]] = [
        (_LDX_W, 2, 1, 0, 0),  # r2 = ctx->access_type
        (_AND_K, 2, 0, 0, 0xFFFF),  # r2 = device type
        (_JNE_K, 2, 0, "allow", BPF_DEVCG_DEV_CHAR),  # a block device: not ours
        (_LDX_W, 3, 1, 4, 0),  # r3 = ctx->major
        (_LDX_W, 4, 1, 8, 0),  # r4 = ctx->minor
    ]
    for major, minor in allow:
        code += [(_JNE_K, 3, 0, 2, major), (_JNE_K, 4, 0, 1, minor), (_JA, 0, 0, "allow", 0)]
    code += [(_JEQ_K, 3, 0, "deny", major) for major in deny]
    labels = {"allow": len(code), "deny": len(code) + 2}
    code += [(_MOV_K, 0, 0, 0, 1), (_EXIT, 0, 0, 0, 0), (_MOV_K, 0, 0, 0, 0), (_EXIT, 0, 0, 0, 0)]
    out = bytearray()
    for pc, (op, dst, src, off, imm) in enumerate(code):
        rel = labels[off] - pc - 1 if isinstance(off, str) else off
        out += _insn(op, dst, src, rel, imm)
    return bytes(out)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise BpfUnavailable(errno.ENOSYS, f"bpf(2) is not known on {platform.machine()}")
    ret = _libc.syscall(ctypes.c_long(number), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfUnavailable(err, os.strerror(err))
    return int(ret)


def load(program: bytes) -> int:
    """Load ``program`` as a cgroup device program; its file descriptor."""
    insns = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into(
        "<IIQQIIQII16sII",
        attr,
        0,
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(program) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1,  # log_level: the verifier says why it refuses
        len(log),
        ctypes.addressof(log),
        0,  # kern_version
        0,  # prog_flags
        b"mtgpu_gpu_wall",
        0,  # prog_ifindex
        BPF_CGROUP_DEVICE,  # expected_attach_type
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except BpfUnavailable as exc:
        said = log.value.decode(errors="replace").strip().splitlines()
        raise BpfUnavailable(
            exc.errno, f"loading the GPU device program: {exc.strerror}" + (f" ({said[-1]})" if said else "")
        ) from None


def attach(cgroup_dir: str, allowed: Iterable[tuple[int, int]], majors: Iterable[int]) -> None:
    """Wall the cgroup at ``cgroup_dir`` (cgroup v2) off from the GPU devices of
    ``majors`` but ``allowed``. Raises :class:`BpfUnavailable` when it cannot."""
    prog = load(assemble(allowed, majors))
    try:
        fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        os.close(prog)
        raise
    try:
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("<IIII", attr, 0, fd, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
        try:
            _bpf(BPF_PROG_ATTACH, attr)
        except BpfUnavailable as exc:
            raise BpfUnavailable(
                exc.errno, f"attaching the GPU device program to {cgroup_dir}: {exc.strerror}"
            ) from None
    finally:
        os.close(fd)
        os.close(prog)


@functools.cache
def unavailable() -> str | None:
    """Why this kernel cannot load a GPU device program, or None when it can (asked
    once: the daemon's start-up report and ``mtgpu-setup status`` say it)."""
    try:
        os.close(load(assemble([], [195])))
    except OSError as exc:
        return str(exc)
    return None
