"""Attacks from a member that names an image (R17–R19), on a real agent as root: the image
comes from a real dockerd of the session's own (tests/dockerd.py, busybox's applets), the
member runs under the same OCI runtime as every other. Before issue 46's wall an image's
member ran under docker with the node's network and the host's view of loopback; its env
went to the runtime's CLI through an env file."""

from tests.dockerd import IMAGE

from .conftest import SECRET
from .test_wall import denied, said

# busybox's nc: REACHED or denied.
DIAL = """
dial() {
  if timeout 3 nc "$2" "$3" </dev/null >/dev/null 2>&1; then
    echo "$1: REACHED $2:$3"
  else
    echo "$1: denied $2:$3"
  fi
}
"""


def test_R17_an_images_PATH_and_LD_PRELOAD_never_run_as_root(image_node):
    """B's image member plants programs and a preload library and names them in its env;
    the agent's root side (the runtime's CLI, mount, runc, the keeper) runs none of them,
    in this member's start, its stop, or the next image member's."""
    plant = """
mkdir -p "$TUNEPLANE_SCRATCH_DIR/.x"
for name in docker mount umount runc tini sh python3 tar id; do
  printf '#!/bin/sh\\necho "PLANTED $0 ran as $(id -u)" >&2\\n' > "$TUNEPLANE_SCRATCH_DIR/.x/$name"
  chmod +x "$TUNEPLANE_SCRATCH_DIR/.x/$name"
done
echo "planted as $(id -u)"
"""
    scratch = image_node.executor.scratch
    env = {
        "PATH": f"{scratch}/m-b/.x:{scratch}/m-b2/.x:/bin",
        "LD_PRELOAD": f"{scratch}/m-b/.x/evil.so",
        "DOCKER_HOST": "tcp://127.0.0.1:1",
        "PYTHONPATH": f"{scratch}/m-b/.x",
    }
    output, ended = image_node.attack(plant, image=IMAGE, env=env)
    assert "planted as 6" in output and ended.exit_code == 0, output
    image_node.start("m-b2", image=IMAGE, script="exec sleep 30", env=env)
    image_node.clean("m-b2")
    output += image_node.output("m-b2")
    assert "ran as 0" not in output, output
    assert "PLANTED" not in output.replace("PLANTED $0", ""), output


def test_R18_an_image_member_has_its_uid_no_capabilities_a_filter_and_a_read_only_root(
    image_node,
):
    script = """
echo "uid: $(id -u) gid $(id -g) groups $(id -G)"
grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
if touch /bin/owned 2>/dev/null; then echo "root: WRITTEN"; else echo "root: denied"; fi
if unshare -U -r id 2>/dev/null; then echo "userns: MADE"; else echo "userns: denied"; fi
if mount -t tmpfs none /tmp 2>/dev/null; then echo "mount: MADE"; else echo "mount: denied"; fi
ls /usr/lib/python3* >/dev/null 2>&1 && echo "host-usr: SEEN" || echo "host-usr: denied"
ls /dev/nvidia0 /dev/nvidia2 2>&1 | grep -c 'No such' | sed 's/^/absent cards: /'
[ -c /dev/nvidia1 ] && echo "own card: there"
for dir in /tmp /var/tmp /dev/shm; do echo "writable $dir: $(echo x > $dir/x && echo yes)"; done
"""
    output, ended = image_node.attack(script, image=IMAGE)
    assert ended.exit_code == 0, output
    uid = said(output, "uid").split()[1]
    assert uid.startswith("6") and f"gid {uid} groups {uid}" in output, output
    assert "CapEff:\t0000000000000000" in output and "CapBnd:\t0000000000000000" in output
    assert "NoNewPrivs:\t1" in output and "Seccomp:\t2" in output, output
    denied(output, "root", "userns", "mount", "host-usr")
    assert "absent cards: 2" in output and "own card: there" in output, output
    for place in ("/tmp", "/var/tmp", "/dev/shm"):  # an image without them gets them too
        assert f"writable {place}: yes" in output, output


def test_R19_an_image_member_reaches_neither_redis_nor_postgresql_nor_another_member(
    image_node,
):
    victim = image_node.victim()  # A's member, a process member with its own address
    script = DIAL
    script += "dial redis 127.0.0.1 6379\ndial postgresql 127.0.0.1 5432\n"
    script += f"dial other-member {victim.address} 22\n"
    script += "gateway=$(ip -4 route | awk '/default/ {print $3}')\n"
    script += 'dial gateway-redis "$gateway" 6379\necho "gateway: $gateway"\n'
    output, _ = image_node.attack(script, image=IMAGE)
    assert "gateway: 10." in output, output
    denied(output, "redis", "postgresql", "gateway-redis", "other-member")
    assert SECRET not in output
