"""The beat schedule, in one place: seeded into django-celery-beat's tables, where an
administrator sees each periodic task in the admin and can pause it.

Seeding runs after every migrate (and ``manage.py seed_schedule``). It sets each
entry's task, interval and expiry from settings, and keeps whether an
administrator paused it. Every entry expires after one interval, so a backed-up
queue never runs a stale sweep.
"""

from django.conf import settings

# name shown in the admin -> (task, the setting that gives its interval in seconds)
SCHEDULE = {
    "Liveness sweep": ("nodes.liveness_sweep", "TUNEPLANE_SWEEP_INTERVAL"),
    "Storage cordon sweep": ("nodes.storage_cordon_sweep", "TUNEPLANE_SWEEP_INTERVAL"),
    "Drain deadlines": ("nodes.drains_overdue_mark", "TUNEPLANE_SWEEP_INTERVAL"),
    "Health checks": ("nodes.health_checks_run", "TUNEPLANE_SWEEP_INTERVAL"),
    "Cluster Fleets read": ("nodes.clusters_refresh", "TUNEPLANE_CLUSTER_REFRESH_INTERVAL"),
    "Cluster jobs' states": ("placement.cluster_jobs_track", "TUNEPLANE_CLUSTER_REFRESH_INTERVAL"),
    "Allocation pass": ("placement.allocate_all", "TUNEPLANE_ALLOCATION_INTERVAL"),
    "Members reconcile": ("placement.members_reconcile", "TUNEPLANE_SWEEP_INTERVAL"),
    "Rollout deadlines": ("placement.rollouts_settle", "TUNEPLANE_SWEEP_INTERVAL"),
    "Playground lifetimes": ("placement.sessions_expire", "TUNEPLANE_SWEEP_INTERVAL"),
    "Episode timeouts": ("placement.episodes_time_out", "TUNEPLANE_SWEEP_INTERVAL"),
}


def seed_schedule(**_) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    for name, (task, setting) in SCHEDULE.items():
        every = getattr(settings, setting)
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=every, period=IntervalSchedule.SECONDS
        )
        PeriodicTask.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "interval": interval,
                "expire_seconds": every,
                "description": f"Every {setting} seconds; expires after one interval.",
            },
        )
