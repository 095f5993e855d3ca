"""A member that names an image (R17, R18), decided without a runtime: what of the image it
runs by (env, entrypoint, command), the bundle of such a member (the image's root, the
static init, nothing of the host's /usr or /etc), and what of an image's filesystem is
ever written to the node (files, dirs and links inside its root; no device file, no set-uid
bit, nothing outside)."""

import io
import stat
import tarfile

import pytest

from nodes.agent.member import bundle, images, launch

IMAGE_ID = "ab" * 32


def test_R18_the_image_runtime_inspect_gives_its_id_env_entrypoint_and_command():
    inspected = {
        "Id": f"sha256:{IMAGE_ID}",
        "Config": {
            "Env": ["PATH=/opt/bin:/bin", "EMPTY=", "A=b=c", "noequals"],
            "Entrypoint": ["/entry", "-x"],
            "Cmd": ["serve", "--port", "8000"],
            "User": "0",  # the image's wish: a member runs as its own uid
        },
    }
    found = images.config_of(inspected)
    assert found.id == IMAGE_ID
    assert dict(found.env) == {"PATH": "/opt/bin:/bin", "EMPTY": "", "A": "b=c"}
    assert found.entrypoint == ("/entry", "-x")
    assert found.cmd == ("serve", "--port", "8000")


@pytest.mark.parametrize("image_id", ["", "sha256:", "sha256:../../etc", "sha256:AB12", None])
def test_R17_an_image_id_that_is_not_a_digest_is_refused(image_id):
    """The id names a dir under the agent's state dir: nothing but hex ever does."""
    with pytest.raises(images.ImageError):
        images.config_of({"Id": image_id, "Config": {}})


def test_an_image_without_config_runs_what_the_member_gives():
    found = images.config_of({"Id": IMAGE_ID, "Config": None})
    assert (found.env, found.entrypoint, found.cmd) == ((), (), ())
    assert images.argv_of(found, ["/bin/true"], None) == ["/bin/true"]


def test_R18_what_runs_is_the_entrypoint_with_the_members_argv_or_the_images_command():
    image = images.Image(id=IMAGE_ID, entrypoint=("/entry",), cmd=("default", "args"))
    assert images.argv_of(image, ["mine"], None) == ["/entry", "mine"]
    assert images.argv_of(image, [], None) == ["/entry", "default", "args"]
    bare = images.Image(id=IMAGE_ID, cmd=("/bin/sh",))
    assert images.argv_of(bare, ["/bin/echo", "hi"], None) == ["/bin/echo", "hi"]
    assert images.argv_of(bare, None, None) == ["/bin/sh"]


def test_R18_a_script_runs_by_the_images_own_shell_whatever_its_entrypoint():
    image = images.Image(id=IMAGE_ID, entrypoint=("/entry",), cmd=("x",))
    argv = images.argv_of(image, [], "/run/tuneplane/script.sh")
    assert argv == ["/bin/sh", "-c", images.SCRIPT_RUNNER, "/run/tuneplane/script.sh"]


def test_a_member_with_nothing_to_run_is_refused():
    with pytest.raises(images.ImageError, match="no command"):
        images.argv_of(images.Image(id=IMAGE_ID), [], None)


def test_R4_the_members_env_is_the_images_then_its_home_then_its_own():
    image = images.Image(id=IMAGE_ID, env=(("PATH", "/bin"), ("HOME", "/root"), ("LANG", "C")))
    env = images.env_of(image, {"LR": "3e-4", "LANG": "en"}, home="/scratch/m-1")
    assert env == {"PATH": "/bin", "HOME": "/scratch/m-1", "LANG": "en", "LR": "3e-4"}
    # An image that names no PATH runs with the system's, as the runtime's `run` gives.
    assert images.env_of(images.Image(id=IMAGE_ID), {}, home="/h")["PATH"] == launch.SYSTEM_PATH


def _sandbox(**changes) -> bundle.Sandbox:
    base = {
        "uid": 61234,
        "argv": ("/entry",),
        "env": {"PATH": "/bin"},
        "cwd": "/var/lib/tuneplane/members/m-1",
        "hostname": "m-1",
        "cgroups_path": "/tuneplane/node-1/m-1",
    }
    return bundle.Sandbox(**{**base, **changes})


def test_R18_an_image_members_root_is_the_images_with_the_static_init_as_pid_1():
    config = bundle.config(_sandbox(host_root=False, init=images.INIT_AT), seccomp=None)
    destinations = [mount["destination"] for mount in config["mounts"]]
    assert "/usr" not in destinations and "/etc" not in destinations
    assert config["process"]["args"][:2] == [images.INIT_AT, "--"]
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert config["process"]["noNewPrivileges"] is True
    for kind in ("pid", "ipc", "uts", "mount", "network", "cgroup"):
        assert {"type": kind} in config["linux"]["namespaces"]
    # A process member keeps the host's /usr and /etc, read-only, and the host's init.
    host = bundle.config(_sandbox(), seccomp=None)
    host_mounts = {m["destination"]: m for m in host["mounts"]}
    assert "ro" in host_mounts["/usr"]["options"] and "ro" in host_mounts["/etc"]["options"]
    assert host["process"]["args"][0] == bundle.INIT


def test_R17_nothing_is_made_or_followed_in_an_images_root(tmp_path):
    """An image's root is the tenant's: a link it holds (``/tmp → /etc``) is never followed
    by the root side (writing a process member's root chmods its /tmp 1777)."""
    outside = tmp_path / "etc"
    outside.mkdir(mode=0o755)
    rootfs = tmp_path / "bundle" / "rootfs"
    rootfs.mkdir(parents=True)
    (rootfs / "tmp").symlink_to(outside)
    bundle.write(tmp_path / "bundle", {"ociVersion": "1.0.2"}, host_root=False)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755
    assert sorted(p.name for p in rootfs.iterdir()) == ["tmp"]
    assert (tmp_path / "bundle" / "config.json").is_file()


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def _info(name: str, kind=tarfile.REGTYPE, mode=0o644, size=0, link="") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    return info


def _extract(tmp_path, buffer):
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(fileobj=buffer, mode="r|") as tar:
        tar.extractall(root, numeric_owner=True, filter=images._kept)
    return root


def test_R17_an_images_device_files_fifos_and_set_uid_bits_never_reach_the_node(tmp_path):
    root = _extract(
        tmp_path,
        _tar(
            (_info("bin/su", mode=0o4755, size=2), b"#!"),
            (_info("dev/sda", kind=tarfile.BLKTYPE), None),
            (_info("dev/mem", kind=tarfile.CHRTYPE), None),
            (_info("run/fifo", kind=tarfile.FIFOTYPE), None),
            (_info("bin/sh", kind=tarfile.SYMTYPE, link="/bin/busybox"), None),
        ),
    )
    assert stat.S_IMODE((root / "bin" / "su").stat().st_mode) == 0o755  # no set-uid bit
    assert not (root / "dev" / "sda").exists() and not (root / "dev" / "mem").exists()
    assert not (root / "run" / "fifo").exists()
    assert (root / "bin" / "sh").is_symlink()  # an absolute link inside the image is its own


def test_R17_an_images_absolute_path_lands_inside_its_root(tmp_path):
    absolute = str(tmp_path / "owned")
    root = _extract(tmp_path, _tar((_info(absolute, size=1), b"x")))
    assert not (tmp_path / "owned").exists()
    assert (root / absolute.lstrip("/")).read_bytes() == b"x"


def test_R17_an_image_never_writes_above_its_root(tmp_path):
    with pytest.raises(tarfile.FilterError):
        _extract(tmp_path, _tar((_info("../owned", size=1), b"x")))
    assert not (tmp_path / "owned").exists()


def test_R17_an_image_never_writes_through_a_link_it_planted(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(tarfile.FilterError):
        _extract(
            tmp_path,
            _tar(
                (_info("etc", kind=tarfile.SYMTYPE, link=str(outside)), None),
                (_info("etc/passwd", size=1), b"x"),
            ),
        )
    assert not (outside / "passwd").exists()


def test_an_image_reference_that_reads_as_an_option_is_refused():
    with pytest.raises(images.ImageError, match="not an image reference"):
        images.resolve("docker", "--help", always_pull=False)
