"""R12 on cgroup v2, without a kernel: the device program the agent assembles, run by a small
interpreter of the eBPF instructions it uses, allows exactly what the rules allow (the
kernel's own run is tests/nodes/test_isolation.py's v2 test)."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.agent.member import devices
from nodes.agent.member.isolation import BASIC_DEVICES


def run(program: bytes, kind: int, major: int, minor: int, access: int) -> int:
    """What the kernel's eBPF machine returns for one open or mknod."""
    context = struct.pack("<III", access << 16 | kind, major, minor)
    registers = [0] * 11
    at = 0
    while True:
        code, regs, off, imm = struct.unpack_from("<BBhi", program, at * 8)
        dst, src = regs & 0xF, regs >> 4
        at += 1
        if code == devices.LDX_W:
            assert src == 1
            registers[dst] = struct.unpack_from("<I", context, off)[0]
        elif code == devices.AND_K:
            registers[dst] &= imm & 0xFFFFFFFFFFFFFFFF
        elif code == devices.RSH_K:
            registers[dst] >>= imm
        elif code == devices.MOV_X:
            registers[dst] = registers[src]
        elif code == devices.MOV_K:
            registers[dst] = imm
        elif code == devices.JNE_K:
            if registers[dst] != imm & 0xFFFFFFFFFFFFFFFF:
                at += off
        elif code == devices.EXIT:
            return registers[0]
        else:
            raise AssertionError(f"an instruction the agent does not write: {code:#x}")


def allowed(rules, kind, major, minor, access) -> bool:
    """v1's devices.allow, read plainly."""
    return any(
        (rule.kind == "a" or (rule.kind == "c") == (kind == devices.DEV_CHAR))
        and access & ~rule.access == 0
        and rule.major in (None, major)
        and rule.minor in (None, minor)
        for rule in rules
    )


RULES = st.builds(
    devices.Rule,
    kind=st.sampled_from("abc"),
    major=st.one_of(st.none(), st.integers(0, 300)),
    minor=st.one_of(st.none(), st.integers(0, 300)),
    access=st.integers(1, 7),
)
ASKED = st.tuples(
    st.sampled_from([devices.DEV_BLOCK, devices.DEV_CHAR]),
    st.integers(0, 300),
    st.integers(0, 300),
    st.integers(1, 7),
)


@given(st.lists(RULES, max_size=12), st.lists(ASKED, min_size=1, max_size=20))
def test_R12_the_program_allows_exactly_what_its_rules_allow(rules, asked):
    program = devices.program(rules)
    for kind, major, minor, access in asked:
        assert run(program, kind, major, minor, access) == allowed(
            rules, kind, major, minor, access
        ), (rules, kind, major, minor, access)


def test_R12_a_member_opens_its_own_card_and_the_basics_and_nothing_else():
    rules = [devices.parse(rule) for rule in [*BASIC_DEVICES, "c 195:1 rwm"]]
    program = devices.program(rules)
    read_write = devices.ACCESS["r"] | devices.ACCESS["w"]
    assert run(program, devices.DEV_CHAR, 195, 1, read_write) == 1  # its card
    assert run(program, devices.DEV_CHAR, 195, 255, read_write) == 1  # nvidiactl
    assert run(program, devices.DEV_CHAR, 1, 3, read_write) == 1  # /dev/null
    assert run(program, devices.DEV_CHAR, 195, 0, read_write) == 0  # another member's card
    assert run(program, devices.DEV_BLOCK, 195, 1, read_write) == 0  # not a char device
    assert run(program, devices.DEV_BLOCK, 8, 0, devices.ACCESS["r"]) == 0  # the host's disk


def test_a_device_rule_is_read_as_devices_allow_writes_it():
    assert devices.parse("c 195:1 rwm") == devices.Rule("c", 195, 1, 7)
    assert devices.parse("c 136:* rw") == devices.Rule("c", 136, None, 6)
    assert devices.parse("b *:* m") == devices.Rule("b", None, None, 1)
    assert devices.parse("a") == devices.Rule("a", None, None, 7)
    with pytest.raises(ValueError, match="not a device rule"):
        devices.parse("c 195 rwm")
