"""The member runner: starts what a ``start`` asks (R4), stops (R10) and cleans (R7) what the
console says, and advances every member on an explicit ``tick`` — an exit noticed, a stop
escalated to SIGKILL, a replica restarted after its backoff, a cleanup finished. Nothing
happens to a member between ticks but what the console asks; reading the store changes
nothing. Every decision is member/policy.py's; this module observes and acts."""

import contextlib
import logging
import os
import resource
import subprocess
import time
from pathlib import Path

from .. import state
from ..command import COMMAND_ID, process_start_time
from ..wire import MemberSpec, Refused
from . import (
    bundle,
    cgroups,
    images,
    isolation,
    launch,
    logs,
    network,
    policy,
    resolver,
    sandbox,
    scratchfs,
)
from .drivers import ContainerDriver, ProcessDriver, driver_of
from .record import FAILED, RUNNING, Member
from .store import Store

logger = logging.getLogger("tuneplane-node")

SCRATCH_EVERY = 10.0
# Where a confined member's script is, read-only, in its own /run.
SCRIPT_AT = "/run/tuneplane/script.sh"  # seconds between measurements of a member's scratch dir


def served_ports(spec: MemberSpec) -> list[int]:
    """The ports mapped from the node to a confined member (R19): a replica's, and a gang's
    rendezvous port on its rank 0, which the other ranks dial."""
    ports = [spec.serve.port] if spec.serve is not None else []
    master = str(spec.rendezvous.get("MASTER_PORT", ""))  # a number as the console sends it
    if str(spec.rendezvous.get("RANK")) == "0" and master.isdigit():
        ports.append(int(master))
    return ports


class Runner:
    def __init__(
        self,
        store: Store,
        root: Path,
        *,
        devices=lambda: [],
        storage_root: str | None = None,
        scope: str = "local",
        runtime=lambda: "",
        uids: tuple[int, int] | None = None,
        deny_cidrs: list[str] | None = None,
    ):
        self.store = store
        self.root = root
        # The uids members run as (R11); None: as the agent's own user.
        self.uids = uids
        self.logs = root / "logs"
        self.scratch = root / "members"
        # The networks no confined member reaches beside the node's own (R19).
        self.deny_cidrs = list(deny_cidrs or [])
        # A confined member's scratch with a limit: an ext4 image of that size (R21).
        self.images = root / "scratch-images"
        # The cards this node has now, as its inventory reports them ({index, uuid}).
        self.devices = devices
        self.storage_root = storage_root
        # The agent's cgroups are under tuneplane/<scope>/ (the node id): its own only.
        self.scope = scope
        # The container runtime this node has now ("docker", "podman" or ""), for an image.
        self.runtime = runtime
        self.children: dict[str, subprocess.Popen] = {}
        # When each member's scratch dir was last measured (R16): a walk of its tree, so
        # not on every tick.
        self.scratch_every = SCRATCH_EVERY
        self.scratch_seen: dict[str, float] = {}
        # Confined members' bundles and the OCI runtime's state (R18).
        self.sandbox = sandbox.Paths(root)
        self.seccomp = None  # containers-common's profile, read at the first confined start

    def cgroup(self, member_id: str) -> str:
        return f"{self.scope}/{member_id}"

    # What the console asks -----------------------------------------------------------------

    def start(self, member_id: str, payload, now: float | None = None) -> Member:
        """Persisted before it starts (R4); a start this node refuses is recorded failed,
        never run (R1)."""
        now = time.time() if now is None else now
        member = Member(command_id=member_id, boot_id=launch.boot_id())
        try:
            spec = MemberSpec.parse(payload)
            held = {
                card["index"]
                for other in self.store.members()
                if other.holds_cards
                for card in other.cards
            }
            refusal = policy.refusal(spec, self.devices(), held, self.runtime())
        except Refused as error:
            spec, refusal = None, str(error)
        if refusal:
            member.state, member.exit_code, member.reason = FAILED, policy.VANISHED, "refused"
            member.cleaned, member.detail = True, refusal[: policy.MAX_DETAIL]
            logger.warning("member %s %s", member_id, refusal)
            self.store.save(member)
            return member
        member.cards = [{"index": card.index, "uuid": card.uuid} for card in spec.cards]
        member.grace, member.log_bytes = spec.grace, spec.log_bytes
        member.scratch_bytes = spec.scratch_bytes
        member.output_tail = spec.health_check
        if spec.serve is not None:
            member.serve = {"port": spec.serve.port, "readiness_path": spec.serve.readiness_path}
            member.spec = payload  # what a restart starts again
        self.store.save(member)
        self._launch(member, spec, now)
        return member

    def stop(self, member: Member, grace: float, now: float | None = None) -> Member:
        """SIGTERM to its process group and cgroup (and its container), SIGKILL once the
        grace is over (R10): a later tick sends it."""
        now = time.time() if now is None else now
        member = self.advance(member, now)
        if member.state != RUNNING or member.stop_at is not None:
            return member
        member.stop_at, member.grace = now, grace
        reached = cgroups.signal_member(
            self._group(member), self.cgroup(member.command_id), cgroups.SIGTERM
        )
        member.term_pending = bool(member.sandbox) and not reached
        self.store.save(member)
        driver_of(member).terminate(member, grace)
        return self._escalate(member, now)

    def cleanup(self, member: Member, grace: float, now: float | None = None) -> Member:
        """A stop, then everything it left removed once it has ended (R7)."""
        now = time.time() if now is None else now
        member = self.stop(member, grace, now)
        member.cleanup_wanted = True
        self.store.save(member)
        return self.advance(member, now)

    def clean_unknown(self, member_id: str) -> None:
        """A cleanup for a member this node has no record of (a lost state file): whatever
        carries its id is removed all the same (R7)."""
        if not COMMAND_ID.fullmatch(member_id):
            return
        cgroup = self.cgroup(member_id)
        cgroups.kill_all(cgroup)
        if self.runtime():
            ContainerDriver(self.runtime()).remove(member_id)
        sandbox.delete(self.sandbox, member_id)
        cgroups.release(cgroup)
        self._remove_scratch(member_id)
        self._detach(member_id)

    # The tick --------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Every member advanced once."""
        now = time.time() if now is None else now
        with self.store.lock:
            for member in self.store.members():
                self.advance(member, now)

    def advance(self, member: Member, now: float) -> Member:
        if member.state != RUNNING:
            if member.cleanup_wanted and not member.cleaned:
                self._clean(member, now)
            return member
        if member.log_bytes and not member.sandbox:  # a confined member's keeper cuts its own
            logs.cut(self.logs / f"{member.command_id}.log", member.log_bytes)
        if member.restart_at is not None:
            return self._restart_due(member, now)
        child = self.children.get(member.command_id)
        if child is not None:
            child.poll()  # reap it, so its pid is not a zombie
        driver = driver_of(member)
        leader = self._leader(member)
        exit_code = self.store.exit_code(member.command_id, policy.VANISHED)
        seen = policy.Observed(
            exit_code=exit_code,
            oom=exit_code is not None and driver.oom(member, self.cgroup(member.command_id)),
            leader_alive=leader is not None,
            container=driver.container_state(member) if leader is None else None,
            stopping=member.stop_at is not None,
            boot_then=member.boot_id,
            boot_now=launch.boot_id(),
        )
        outcome = policy.ended(seen)
        if outcome is None:
            self._watch_scratch(member, now)
            self._watch_checkpoint(member, now)
            return self._escalate(member, now)
        code, reason = outcome
        if member.limit_hit and reason == "stopped":
            reason = member.limit_hit  # it was stopped for the limit it went past
        self.children.pop(member.command_id, None)
        restart = policy.restart_after_exit(
            serving=member.serve is not None,
            stopping=member.stopping,
            launched_at=member.launched_at,
            backoff=member.backoff,
            code=code,
            reason=reason,
            now=now,
        )
        if restart is not None:
            member.exit_code, member.restart_at, member.backoff = code, restart.at, restart.backoff
            member.ready, member.pid, member.started = False, None, None
            member.reason, member.detail = "restarting", restart.detail
            self.store.save(member)
            return member
        member.state = policy.final_state(code, reason)
        member.exit_code, member.reason = code, reason
        if member.output_tail:  # H5: what a health check said, for its result
            read = logs.read(self.logs / f"{member.command_id}.log", policy.MAX_DETAIL)
            member.detail = read.data.decode(errors="replace") if read else ""
        if member.cleanup_wanted:
            self._clean(member, now)
        self.store.save(member)
        return member

    def _restart_due(self, member: Member, now: float) -> Member:
        """A replica waiting out its restart backoff: stopped meanwhile, it ends; due, its
        process starts again from the start it was given."""
        if member.stopping:
            member.state, member.reason, member.restart_at = FAILED, "stopped", None
            member.exit_code = policy.VANISHED if member.exit_code is None else member.exit_code
            if member.cleanup_wanted:
                self._clean(member, now)
            self.store.save(member)
        elif now >= member.restart_at:
            member.restart_at, member.restarts, member.reason = None, member.restarts + 1, ""
            self.store.path(member.command_id, ".exit").unlink(missing_ok=True)
            try:
                spec = MemberSpec.parse(member.spec or {})
            except Refused as error:  # a record an older agent wrote, say
                member.state, member.reason, member.detail = FAILED, "refused", str(error)
                self.store.save(member)
                return member
            self._launch(member, spec, now)
        return member

    def _watch_scratch(self, member: Member, now: float) -> None:
        """R16: a member whose scratch dir grew past its limit is stopped (SIGTERM, SIGKILL
        after its grace) and ends ``scratch_full``; measured every ``scratch_every`` s."""
        if not member.scratch_bytes or member.stop_at is not None or member.limit_hit:
            return
        if scratchfs.mounted(self.scratch / member.command_id):
            return  # its scratch is a filesystem of that size: full is ENOSPC to it (R21)
        if now - self.scratch_seen.get(member.command_id, 0.0) < self.scratch_every:
            return
        self.scratch_seen[member.command_id] = now
        if logs.du(self.scratch / member.command_id) > member.scratch_bytes:
            logger.warning(
                "member %s: scratch dir past %d bytes", member.command_id, member.scratch_bytes
            )
            member.limit_hit, member.detail = "scratch_full", "its scratch dir is full"
            self.stop(member, member.grace, now)

    def _watch_checkpoint(self, member: Member, now: float) -> None:
        """H4: the member's checkpoint mark changed since the last tick — a checkpoint saved,
        noted at the agent's own time. Never followed: a link the member planted there is
        no mark (and tells it nothing of what it names)."""
        seen = policy.mark_seen(self.scratch / member.command_id / launch.CHECKPOINT_MARK)
        if policy.checkpoint_marked(member.checkpoint_seen, seen):
            member.checkpoint_at = now
        if seen != member.checkpoint_seen or member.checkpoint_at == now:
            member.checkpoint_seen = seen
            self.store.save(member)

    def _escalate(self, member: Member, now: float) -> Member:
        """A stop under way: SIGKILL once the grace is over; unkillable a minute after."""
        step = policy.escalation(member.stop_at, member.grace, member.killed_at, member.reason, now)
        if step == "kill":
            cgroup = self.cgroup(member.command_id)
            cgroups.signal_member(self._group(member), cgroup, cgroups.SIGKILL)
            cgroups.kill_all(cgroup)
            driver_of(member).kill(member)
            member.killed_at = now
            self.store.save(member)
        elif step == "unkillable":
            member.reason = "unkillable"
            self.store.save(member)
        elif member.killed_at is not None and member.sandbox:
            # Killed while its runtime was still starting it: what started since dies too.
            cgroups.kill_all(self.cgroup(member.command_id))
        elif member.term_pending and cgroups.signal_member(
            None, self.cgroup(member.command_id), cgroups.SIGTERM
        ):
            # Stopped while its runtime was still starting it: the SIGTERM, now it is there.
            member.term_pending = False
            self.store.save(member)
        return member

    def _clean(self, member: Member, now: float) -> None:
        """Whatever the member left is gone: its processes, cgroup and scratch dir (R7)."""
        cgroup = self.cgroup(member.command_id)
        cgroups.signal_member(self._group(member), cgroup, cgroups.SIGKILL)
        cgroups.kill_all(cgroup)  # R13: the whole cgroup, a fork racing the kill included
        gone = driver_of(member).remove(member.command_id)
        if member.sandbox:
            gone = sandbox.delete(self.sandbox, member.command_id) and gone
        cgroups.release(cgroup)
        gone = self._remove_scratch(member.command_id) and gone
        if member.sandbox:
            gone = self._detach(member.command_id) and gone
        for suffix in (".env", ".sh"):  # a container's env file and script
            self.store.path(member.command_id, suffix).unlink(missing_ok=True)
        member.cleaned = gone and not cgroups.live_pids(cgroup)
        if member.cleaned and member.uid is not None:
            # R20: its uid is handed out again only once nothing runs as it.
            member.cleaned = member.uid not in isolation.uids_running()
        if not member.cleaned:
            # Something of it outlived SIGKILL: a minute on, it is unkillable (stuck in the
            # kernel); the node is cordoned for it and its cards stay held (DESIGN §7).
            member.killed_at = member.killed_at or now
            if policy.unkillable(member.killed_at, now):
                member.reason = "unkillable"
        self.store.save(member)

    # Starting its process --------------------------------------------------------------------

    def _launch(self, member: Member, spec: MemberSpec, now: float) -> None:
        scratch = self.scratch / member.command_id
        state.ensure_private_dir(scratch)
        in_container = bool(spec.image)
        if self.uids is not None:
            why_not = self._why_not_confined()
            if not why_not:
                member.uid = member.uid or self._free_uid()
                if member.uid is None:
                    why = f"no free uid in {self.uids[0]}-{self.uids[1]}"
                    return self._not_started(member, why)
            elif os.geteuid() == 0:
                # A root agent that was asked for a wall never runs a member without one.
                return self._not_started(member, f"members cannot be confined: {why_not}")
        else:
            why_not = ""
        if member.uid:  # an image's member too: the runtime's CLI only brings its image
            return self._launch_sandboxed(member, spec, scratch, now)
        driver = ContainerDriver(self.runtime()) if in_container else ProcessDriver()
        member.container = driver.runtime
        # A container's script is written outside its (mounted) scratch dir (R14).
        script_at = self.store.path(member.command_id, ".sh") if in_container else None
        try:
            if member.uid:
                self._hand_over(scratch, member.uid)
            argv = launch.argv_of(spec, scratch, script_at)
        except OSError as error:  # a scratch dir it cannot be given, a script not written
            return self._not_started(member, f"its scratch dir: {error.strerror or error}")
        member.argv = argv[:1]
        argv, limits = driver.launch(
            member,
            spec,
            argv,
            scratch,
            scope=self.scope,
            env=launch.own_env(spec, scratch, self.storage_root),
            storage_root=self.storage_root,
            env_file=self.store.path(member.command_id, ".env"),
            script_at=script_at,
        )
        if in_container:
            env = launch.runtime_env()  # the runtime's CLI never runs with the member's env
        else:
            env = launch.member_env(spec, scratch, self.storage_root)
        confinement, procs = cgroups.confine(
            self.cgroup(member.command_id),
            *limits,
            pids=None if in_container else spec.pids,
        )
        member.confinement = driver.confinement(confinement)
        if member.uid:
            member.confinement += f"; uid {member.uid}"
        elif why_not:
            member.confinement += f"; runs as the agent's user: {why_not}"
        wrapper = ["/bin/sh", "-c", launch.WRAPPER, "sh"]
        exit_file = str(self.store.path(member.command_id, ".exit"))
        self._spawn(member, [*wrapper, exit_file, " ".join(procs), *argv], scratch, env, now)

    def _launch_sandboxed(self, member: Member, spec: MemberSpec, scratch: Path, now: float):
        """R18: the member under the OCI runtime, from a bundle written here, started and
        kept by its keeper (shim.py), whose output is the member's log (R21)."""
        member_id = member.command_id
        # Named first: a start that fails on the way still has its bundle removed at cleanup.
        member.sandbox = sandbox.runtime()
        sandbox.delete(self.sandbox, member_id)  # a replica's last launch, a lost start's
        self.sandbox.ensure()
        box_dir = self.sandbox.bundle(member_id)
        try:
            if not member.restarts:  # a replica's restart keeps what its scratch holds
                state.ensure_private_dir(self.images)
                scratch_image = self.images / f"{member_id}.img"
                member.scratch_fs = scratchfs.make(
                    scratch, scratch_image, spec.scratch_bytes, member.uid
                )
            box_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            binds = list(self._binds(spec, scratch))
            if spec.script:
                # Written in the bundle (root's), never through the scratch dir it owns (R17).
                launch.write_new(box_dir / "script.sh", spec.script)
                binds.append(bundle.Bind(str(box_dir / "script.sh"), SCRIPT_AT, True))
                argv = ["/bin/bash", SCRIPT_AT]
            else:
                argv = list(spec.argv)
        except OSError as error:
            return self._not_started(member, f"its scratch dir: {error.strerror or error}")
        image = None
        if spec.image:
            try:
                image = self._image_root(spec, box_dir)
                argv = images.argv_of(image, spec.argv, SCRIPT_AT if spec.script else None)
            except images.ImageError as error:
                return self._not_started(member, f"its image: {error}")
            binds.append(bundle.Bind(images.INIT_STATIC, images.INIT_AT, True))
        if self.seccomp is None:
            self.seccomp = bundle.load_seccomp()
        if self.seccomp is None:  # never a member without its filter
            why = f"the seccomp profile {bundle.SECCOMP_PROFILE} could not be read"
            return self._not_started(member, why)
        if image is None:
            env = launch.member_env(spec, scratch, self.storage_root, confined=True)
        else:
            own = launch.own_env(spec, scratch, self.storage_root)
            env = images.env_of(image, own, home=str(scratch))
        # The keeper starts now and waits for the word to run the member (a byte on a pipe):
        # its interpreter starts while the network is wired and the bundle written here. A
        # pipe closed without the word (a failure below, the agent gone) ends it, unstarted.
        exit_file = self.store.path(member_id, ".exit")
        log_file = self.logs / f"{member_id}.log"
        reader, writer = os.pipe()
        try:
            keeper = sandbox.keeper_argv(
                self.sandbox, member_id, exit_file, log_file, spec.log_bytes, go_fd=reader
            )
            self._spawn(member, keeper, box_dir, dict(sandbox.FIXED_ENV), now, (reader,))
        finally:
            os.close(reader)
        go = False
        try:
            if member.state == RUNNING:
                go = self._wire_and_write(member, spec, argv, env, binds, image, box_dir)
        finally:
            if go:
                # A keeper gone already (EPIPE) is seen at the next tick: no exit file of its.
                with contextlib.suppress(OSError):
                    os.write(writer, sandbox.GO)
            os.close(writer)

    def _wire_and_write(self, member, spec, argv, env, binds, image, box_dir) -> bool:
        """The member's network (R19) and its bundle's config: whether it may run."""
        member_id = member.command_id
        try:
            attached = network.attach(
                member_id,
                scope=self.scope,
                ports=served_ports(spec),
                state_dir=self.root,
                deny_cidrs=self.deny_cidrs,
            )
        except (network.NetworkError, ValueError, OSError) as error:
            self._not_started(member, f"its network: {error}")
            return False
        member.address = attached.address
        hostname = member_id[:63]
        try:
            names, written = resolver.write(
                box_dir, hostname, attached.address, network.deny_networks(self.deny_cidrs)
            )
        except OSError as error:
            self._not_started(member, f"its resolver files: {error.strerror or error}")
            return False
        binds = [*binds, *written]
        if "MASTER_ADDR" in env:  # a gang's master on this node is reached at its mapping
            env["MASTER_ADDR"] = network.reachable_address(env["MASTER_ADDR"], attached)
        box = bundle.Sandbox(
            uid=member.uid,
            argv=tuple(argv),
            env=env,
            cwd=str(self.scratch / member_id),
            hostname=hostname,
            cgroups_path="/tuneplane/" + self.cgroup(member_id),
            cpus=spec.cpus,
            memory_bytes=spec.memory_bytes,
            pids=spec.pids,
            devices=bundle.card_devices(
                spec.card_indices, {"nvidia-uvm": isolation.char_major("nvidia-uvm")}
            ),
            binds=tuple(binds),
            netns=attached.netns,
            tmp_bytes=min(spec.scratch_bytes or bundle.TMP_BYTES, bundle.TMP_BYTES),
            nofile=min(bundle.NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
            host_root=image is None,
            init=bundle.INIT if image is None else images.INIT_AT,
        )
        try:
            bundle.write(box_dir, bundle.config(box, self.seccomp), host_root=image is None)
        except OSError as error:
            self._not_started(member, f"its bundle: {error.strerror or error}")
            return False
        member.argv = argv[:1]
        root = "read-only /usr and /etc" if image is None else f"image {spec.image}, read-only"
        member.confinement = (
            f"{Path(member.sandbox).name}: uid {member.uid}; pid, ipc, uts, mount, network, "
            f"cgroup namespaces; address {attached.address}; "
            + (f"DNS {', '.join(names.servers)}; " if names.servers else "no DNS server; ")
            + f"no capabilities; seccomp; "
            f"{root}; "
            + ("its cards only" if spec.cards else "no cards")
            + (f"; pids {spec.pids}" if spec.pids else "")
            + f"; {member.scratch_fs}"
        )
        self.store.save(member)
        return True

    def _image_root(self, spec: MemberSpec, box_dir: Path) -> images.Image:
        """The image named, had from the node's container runtime, its filesystem mounted
        as the member's root in its bundle (R18). ImageError when it cannot be."""
        if not os.access(images.INIT_STATIC, os.X_OK):
            raise images.ImageError(f"no {images.INIT_STATIC} on this node (install tini)")
        runtime = self.runtime()
        image = images.resolve(runtime, spec.image, always_pull=spec.pull == "always")
        images.mount_root(images.root_of(runtime, image, self.sandbox.images), box_dir)
        return image

    def _binds(self, spec: MemberSpec, scratch: Path):
        """What of the node a confined member sees beside the runtime's root: its scratch dir,
        and of the storage root only its own volumes (read-write) and datasets (read-only)."""
        yield bundle.Bind(str(scratch), str(scratch))
        if spec.delivery_mode == "shared-mount" and self.storage_root:
            for key, relative in sorted(spec.delivery_env.items()):
                path = str(Path(self.storage_root, str(relative)))
                if Path(path).exists():
                    yield bundle.Bind(path, path, key.startswith("TUNEPLANE_DATASET_"))

    def _why_not_confined(self) -> str:
        """Why a process member cannot be given its wall here: no runtime, or no network."""
        return sandbox.unavailable() or network.unavailable()

    def _detach(self, member_id: str) -> bool:
        """Its network namespace, address and rules gone (R19): whether that worked."""
        try:
            network.detach(member_id, scope=self.scope, state_dir=self.root)
        except (network.NetworkError, ValueError, OSError) as error:
            logger.warning("member %s: its network: %s", member_id, error)
            return False
        return True

    def _remove_scratch(self, member_id: str) -> bool:
        """Its scratch dir gone, unmounted first where it is a filesystem of its own: whether
        nothing of it is left."""
        return scratchfs.remove(self.scratch / member_id, self.images / f"{member_id}.img")

    def _spawn(
        self, member: Member, argv: list[str], cwd: Path, env: dict, now: float, fds=()
    ) -> None:
        state.ensure_private_dir(self.logs)
        log = self.logs / f"{member.command_id}.log"
        try:
            child = launch.spawn(argv, log, cwd=cwd, env=env, pass_fds=fds)
        except OSError as error:
            logger.warning("member %s could not start: %s", member.command_id, error)
            member.state, member.exit_code, member.reason = FAILED, policy.VANISHED, "start_failed"
        else:
            self.children[member.command_id] = child
            member.pid, member.started = child.pid, process_start_time(child.pid)
        member.launched_at, member.boot_id = now, launch.boot_id()
        self.store.save(member)

    def _free_uid(self) -> int | None:
        """R11: a uid no member holds and no process runs as."""
        held = {m.uid for m in self.store.members() if m.uid is not None and not m.cleaned}
        return isolation.pick_uid(*self.uids, held | isolation.uids_running())

    def _hand_over(self, scratch: Path, uid: int) -> None:
        """The member's scratch dir is its own (0700, its uid); the rest of the state dir stays
        root's, 0700: the member sees its scratch dir only through the mount its runtime
        makes. Only the dir itself is handed over: what is in it is the member's already."""
        os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)

    def _not_started(self, member: Member, why: str) -> None:
        logger.warning("member %s not started: %s", member.command_id, why)
        member.state, member.exit_code, member.reason = FAILED, policy.VANISHED, "start_failed"
        member.detail = why[: policy.MAX_DETAIL]
        self.store.save(member)

    def _group(self, member: Member) -> int | None:
        """The process group a signal for the member goes to beside its cgroup: none for a
        confined member, whose keeper stays to record how it ended."""
        return None if member.sandbox else self._leader(member)

    def _leader(self, member: Member) -> int | None:
        """The member's process group, if its leader is still the process it started (a pid
        reused by another job's wrapper is never signalled)."""
        pid = member.pid
        if pid and process_start_time(pid) == member.started and not cgroups.zombie(pid):
            return pid
        return None

    # Readers and the prober's answers -------------------------------------------------------

    def serving(self) -> list[Member]:
        """Replicas whose process runs now: what the readiness probe asks."""
        return [member for member in self.store.members() if member.serving]

    def probed(
        self, member_id: str, error: str, failures: int, launched_at: float | None = None
    ) -> None:
        """A probe's answer, applied to the launch it probed only: an answer from before a
        restart never makes the new process Ready. Written only when it changes something."""
        with self.store.lock:
            member = self.store.get(member_id)
            if not isinstance(member, Member) or not member.serving:
                return
            if launched_at is not None and member.launched_at != launched_at:
                return
            after = policy.probed(member.ready, member.detail, error, failures)
            if after != (member.ready, member.detail):
                member.ready, member.detail = after
                self.store.save(member)

    def log_read(self, member_id: str, limit: int, offset: int | None = None) -> logs.Read | None:
        if not COMMAND_ID.fullmatch(member_id):
            return None
        return logs.read(self.logs / f"{member_id}.log", limit, offset)

    def expire_logs(self, retention_seconds: float, keep: set[str]) -> None:
        for path in logs.expired(self.logs, retention_seconds, keep):
            path.unlink(missing_ok=True)
