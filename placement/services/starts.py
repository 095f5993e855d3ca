"""What a start command asks a node to run (R4, S1): a job member's or a replica's payload."""

from django.conf import settings

from fleets.choices import FleetDelivery

# A gang's rank 0 listens here (torchrun's default), offset by the attempt so that two gangs
# whose rank 0 share a node do not collide.
MASTER_PORT_BASE = 29500


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


def job_payload(job, attempt_number: int, rank: int, cards, rendezvous) -> dict:
    payload = {
        "env": job.env,
        "cards": cards,
        "cpus": job.cpus,
        "memory_bytes": job.memory_bytes,
        "grace_seconds": settings.TUNEPLANE_STOP_GRACE,
        "labels": {
            "TUNEPLANE_JOB": f"{job._meta.model_name}-{job.pk}",
            "TUNEPLANE_ATTEMPT": attempt_number,
            "TUNEPLANE_RANK": rank,
        },
        "delivery": delivery(job),
        "rendezvous": rendezvous(rank) if rendezvous else {},
    }
    return _what(job, payload)


def _what(spec, payload: dict) -> dict:
    """Its argv or script, and the image it runs in (with neither, the image's default)."""
    if spec.command:
        payload["argv"] = spec.command
    elif spec.script:
        payload["script"] = spec.script
    if spec.image:
        payload["image"] = spec.image
    return payload


def _run(spec, cards, fleet, labels: dict) -> dict:
    payload = {
        "env": spec.env,
        "cards": cards,
        "cpus": spec.cpus,
        "memory_bytes": spec.memory_bytes,
        "grace_seconds": settings.TUNEPLANE_STOP_GRACE,
        "labels": labels,
        "delivery": {"mode": fleet.delivery, "env": {}},
        "rendezvous": {},
    }
    return _what(spec, payload)


def _served(spec) -> dict:
    return {"serve": {"port": spec.port, "readiness_path": spec.readiness_path}}


def replica_payload(revision, rank: int, cards) -> dict:
    """A replica: what its revision serves, on its port, probed at its readiness path (S1)."""
    deployment = revision.deployment
    labels = {
        "TUNEPLANE_DEPLOYMENT": deployment.pk,
        "TUNEPLANE_REVISION": revision.number,
        "TUNEPLANE_REPLICA": rank,
    }
    return {**_run(revision, cards, deployment.fleet, labels), **_served(revision)}


def session_payload(session, cards) -> dict:
    """A playground session's process: served like a replica (S4)."""
    labels = {"TUNEPLANE_PLAYGROUND_SESSION": session.pk}
    return {**_run(session, cards, session.fleet, labels), **_served(session)}


def episode_payload(episode, cards) -> dict:
    """An episode's process: run once, never restarted (S5)."""
    environment = episode.environment
    labels = {"TUNEPLANE_ENVIRONMENT": environment.pk, "TUNEPLANE_EPISODE": episode.number}
    return _run(episode, cards, environment.fleet, labels)
