"""R12 on cgroup v2: the device files a member may open, as the eBPF program the kernel runs
on each open and mknod in its cgroup (v2 has no devices controller; runc and systemd do the
same). The program is assembled here from the same allow rules v1's ``devices.allow`` takes
("c 195:1 rwm", "c 136:* rwm"), loaded with bpf(2) and attached to the member's cgroup; the
attachment lives as long as the cgroup, so nothing is left to close or detach.

``program`` is pure (the instructions as bytes); ``attach`` is the two system calls.
"""

import ctypes
import os
import platform
import re
import struct
from dataclasses import dataclass
from pathlib import Path

# linux/bpf.h
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2  # beside what a parent cgroup has attached (systemd's), never instead
SYSCALL_BPF = {"x86_64": 321, "aarch64": 280}
# struct bpf_cgroup_dev_ctx: access_type (access << 16 | type), major, minor; each a u32.
DEV_BLOCK, DEV_CHAR = 1, 2
ACCESS = {"m": 1, "r": 2, "w": 4}
ALL_ACCESS = 7
# The eBPF instructions used: code, then dst and src registers, offset, immediate.
LDX_W, AND_K, RSH_K, MOV_X, MOV_K, JNE_K, EXIT = 0x61, 0x57, 0x77, 0xBF, 0xB7, 0x55, 0x95
LOG_SIZE = 1 << 16


@dataclass(frozen=True)
class Rule:
    """One allow rule: a type ("c", "b", or "a" for both), a major and a minor (None for
    any) and the access it allows (a mask of ACCESS)."""

    kind: str
    major: int | None
    minor: int | None
    access: int


def parse(rule: str) -> Rule:
    """A devices.allow line: ``"c 195:1 rwm"``, ``"c 136:* rwm"`` or ``"a"``."""
    if rule.strip() == "a":
        return Rule("a", None, None, ALL_ACCESS)
    found = re.fullmatch(r"([abc]) (\d+|\*):(\d+|\*) ([rwm]+)", rule.strip())
    if not found:
        raise ValueError(f"not a device rule: {rule!r}")
    kind, major, minor, access = found.groups()

    def number(text):
        return None if text == "*" else int(text)

    return Rule(kind, number(major), number(minor), sum(ACCESS[c] for c in set(access)))


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(rules: list[Rule]) -> bytes:
    """The program: allow (1) what a rule allows, deny (0) everything else. r2 holds the
    device's type, r3 the access asked, r4 and r5 its major and minor."""
    code = [
        _insn(LDX_W, dst=2, src=1, off=0),
        _insn(AND_K, dst=2, imm=0xFFFF),
        _insn(LDX_W, dst=3, src=1, off=0),
        _insn(RSH_K, dst=3, imm=16),
        _insn(LDX_W, dst=4, src=1, off=4),
        _insn(LDX_W, dst=5, src=1, off=8),
    ]
    for rule in rules:
        # Each test jumps past the rule's block when it does not match: (code, dst, imm).
        tests = []
        if rule.kind != "a":
            tests.append([(JNE_K, 2, DEV_CHAR if rule.kind == "c" else DEV_BLOCK)])
        if rule.access != ALL_ACCESS:  # anything asked beyond what it allows: not this rule
            tests.append([(MOV_X, 1, 3), (AND_K, 1, ~rule.access & ALL_ACCESS), (JNE_K, 1, 0)])
        if rule.major is not None:
            tests.append([(JNE_K, 4, rule.major)])
        if rule.minor is not None:
            tests.append([(JNE_K, 5, rule.minor)])
        block = [step for test in tests for step in test]
        length = len(block) + 2  # then: r0 = 1, exit
        for at, (op, dst, value) in enumerate(block):
            if op == JNE_K:
                code.append(_insn(JNE_K, dst=dst, off=length - at - 1, imm=value))
            elif op == MOV_X:
                code.append(_insn(MOV_X, dst=dst, src=value))
            else:
                code.append(_insn(op, dst=dst, imm=value))
        code += [_insn(MOV_K, dst=0, imm=1), _insn(EXIT)]
    code += [_insn(MOV_K, dst=0, imm=0), _insn(EXIT)]
    return b"".join(code)


def _bpf(command: int, attr: bytes) -> int:
    number = SYSCALL_BPF.get(platform.machine())
    if number is None:
        raise OSError(0, f"no bpf(2) number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buffer = ctypes.create_string_buffer(attr, len(attr))
    result = libc.syscall(
        ctypes.c_long(number), ctypes.c_int(command), buffer, ctypes.c_uint(len(attr))
    )
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def attach(cgroup: Path, rules: list[str]) -> None:
    """Load the program for ``rules`` and attach it to the v2 cgroup dir ``cgroup``.
    OSError (with the verifier's words, if it refused) when the kernel will not."""
    instructions = program([parse(rule) for rule in rules])
    insns = ctypes.create_string_buffer(instructions, len(instructions))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    log = ctypes.create_string_buffer(LOG_SIZE)
    load = struct.pack(
        "<IIQQIIQII16s",
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(instructions) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1,
        LOG_SIZE,
        ctypes.addressof(log),
        0,
        0,
        b"tuneplane_dev",
    )
    try:
        program_fd = _bpf(BPF_PROG_LOAD, load.ljust(128, b"\0"))
    except OSError as error:
        said = log.value.decode(errors="replace").strip()
        raise OSError(error.errno, f"the kernel refused the device program: {said}") from None
    try:
        cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attr = struct.pack(
                "<IIIII", cgroup_fd, program_fd, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI, 0
            )
            _bpf(BPF_PROG_ATTACH, attr.ljust(128, b"\0"))
        finally:
            os.close(cgroup_fd)
    finally:
        os.close(program_fd)
