"""What a start command asks a node to run (R4, S1): a job member's, a replica's, a playground
session's or an episode's, each built as the agent's own ``MemberSpec`` (nodes/agent/wire.py),
which the agent parses back: one shape, written in one place for both ends."""

from django.conf import settings

from fleets.choices import FleetDelivery
from nodes.agent.wire import Card, MemberSpec, Serve


def host(address: str) -> str:
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def delivery(job) -> dict:
    """R4: where the job's volumes and datasets are — paths under the node's storage root
    (shared-mount) or the URIs a node pulls from (object-pull)."""
    shared = job.fleet.delivery == FleetDelivery.SHARED_MOUNT
    env = {}
    for kind, records in (("VOLUME", job.volumes.all()), ("DATASET", job.datasets.all())):
        for record in records:
            name = f"TUNEPLANE_{kind}_{record.name.upper().replace('-', '_')}"
            env[name] = (
                f"{job.project.slug}/{kind.lower()}s/{record.name}" if shared else record.uri
            )
    return {"mode": job.fleet.delivery, "env": env}


def _spec(run, cards, labels: dict, limits=None, *, fleet, **given) -> MemberSpec:
    """What every start carries: the record's argv or script and image (with neither, the
    image's default), env, cpus and memory, its cards and labels, and the stop grace."""
    return MemberSpec(
        cards=tuple(Card(card["index"], card["uuid"]) for card in cards),
        argv=tuple(run.command or ()),
        script="" if run.command else (run.script or ""),
        image=run.image or "",
        env=dict(run.env or {}),
        labels=labels,
        cpus=limits[0] if limits else run.cpus,
        memory_bytes=limits[1] if limits else run.memory_bytes,
        grace=float(settings.TUNEPLANE_STOP_GRACE),
        pids=settings.TUNEPLANE_MEMBER_PIDS,
        log_bytes=settings.TUNEPLANE_MEMBER_LOG_BYTES,
        scratch_bytes=settings.TUNEPLANE_MEMBER_SCRATCH_BYTES,
        pull="always" if (fleet.config or {}).get("image_pull") == "always" else "",
        **given,
    )


CHECKPOINTS = "checkpoints"


def checkpoint_dir(job) -> str:
    """H3: where a job's attempts keep what the next one resumes from — a dir that outlives
    each attempt on its Fleet's delivery: under the job's first volume (by name), as a path
    under the node's storage root (shared-mount, which the member sees: its volume is
    mounted) or the URI the member syncs to (object-pull). "" for a job with no volume (or an
    object-pull volume without a URI): it has nowhere that outlives an attempt."""
    volumes = sorted(job.volumes.all(), key=lambda volume: volume.name)
    if not volumes:
        return ""
    volume, key = volumes[0], f"{job._meta.model_name}-{job.pk}"
    if job.fleet.delivery == FleetDelivery.SHARED_MOUNT:
        return f"{job.project.slug}/volumes/{volume.name}/{CHECKPOINTS}/{key}"
    return f"{volume.uri.rstrip('/')}/{CHECKPOINTS}/{key}" if volume.uri else ""


def job_payload(job, attempt_number: int, rank: int, cards, rendezvous, limits=None) -> dict:
    """A job member's start (R4), with its attempt, how many came before it and its
    checkpoint dir (H3), so that a retry resumes where the last attempt stopped."""
    labels = {
        "TUNEPLANE_JOB": f"{job._meta.model_name}-{job.pk}",
        "TUNEPLANE_ATTEMPT": attempt_number,
        "TUNEPLANE_RESTART_COUNT": attempt_number - 1,
        "TUNEPLANE_RANK": rank,
    }
    where = delivery(job)
    checkpoints = checkpoint_dir(job)
    if checkpoints:
        where["env"]["TUNEPLANE_CHECKPOINT_DIR"] = checkpoints
    return _spec(
        job,
        cards,
        labels,
        limits,
        fleet=job.fleet,
        delivery_mode=where["mode"],
        delivery_env=where["env"],
        rendezvous=rendezvous(rank) if rendezvous else {},
    ).payload()


def _served(run, cards, fleet, labels: dict, limits=None) -> dict:
    """A served member: on its port, probed at its readiness path (S1)."""
    serve = Serve(run.port, run.readiness_path)
    return _spec(
        run, cards, labels, limits, fleet=fleet, delivery_mode=fleet.delivery, serve=serve
    ).payload()


def replica_payload(revision, rank: int, cards, limits=None) -> dict:
    """A replica: what its revision serves (S1)."""
    deployment = revision.deployment
    labels = {
        "TUNEPLANE_DEPLOYMENT": deployment.pk,
        "TUNEPLANE_REVISION": revision.number,
        "TUNEPLANE_REPLICA": rank,
    }
    return _served(revision, cards, deployment.fleet, labels, limits)


def session_payload(session, cards, limits=None) -> dict:
    """A playground session's process: served like a replica (S4)."""
    labels = {"TUNEPLANE_PLAYGROUND_SESSION": session.pk}
    return _served(session, cards, session.fleet, labels, limits)


def episode_payload(episode, cards, limits=None) -> dict:
    """An episode's process: run once, never restarted (S5)."""
    environment = episode.environment
    labels = {"TUNEPLANE_ENVIRONMENT": environment.pk, "TUNEPLANE_EPISODE": episode.number}
    fleet = environment.fleet
    spec = _spec(episode, cards, labels, limits, fleet=fleet, delivery_mode=fleet.delivery)
    return spec.payload()
