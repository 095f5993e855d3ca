"""A record's history: the audit events of a job, deployment, playground session or episode
and of its parts (a job's attempts and their members, a deployment's revisions and their
replicas, a session's or an episode's process), oldest first — what its submitter reads to
learn what happened to their work. A read.

One query, whatever the number of parts or events: the parts' ids are subqueries of it. The
record itself is found by the caller through the visibility selectors (F8)."""

from django.db.models import CharField, Q, QuerySet
from django.db.models.functions import Cast

from audit.models import AuditEvent

from .models import Attempt, Deployment, Episode, Job, Member, PlaygroundSession, Revision


def _ids(records: QuerySet) -> QuerySet:
    """The records' primary keys as audit target ids (text)."""
    return records.annotate(target=Cast("pk", CharField())).values("target")


def _label(model) -> str:
    return model._meta.label_lower


def _parts(record) -> list[tuple[str, QuerySet]]:
    if isinstance(record, Job):
        attempts = Attempt.objects.filter(**{Attempt.job_field(record): record})
        return [
            (_label(Attempt), _ids(attempts)),
            (_label(Member), _ids(Member.objects.filter(attempt__in=attempts))),
        ]
    if isinstance(record, Deployment):
        revisions = Revision.objects.filter(deployment=record)
        return [
            (_label(Revision), _ids(revisions)),
            (_label(Member), _ids(Member.objects.filter(revision__in=revisions))),
        ]
    if isinstance(record, PlaygroundSession):
        return [(_label(Member), _ids(Member.objects.filter(session=record)))]
    if isinstance(record, Episode):
        return [(_label(Member), _ids(Member.objects.filter(episode=record)))]
    raise TypeError(f"{type(record).__name__} has no history here")


def record_history(record) -> QuerySet:
    """The audit events of ``record`` and of its parts, oldest first."""
    targets = Q(target_type=_label(type(record)), target_id=str(record.pk))
    for target_type, ids in _parts(record):
        targets |= Q(target_type=target_type, target_id__in=ids)
    return AuditEvent.objects.filter(targets).order_by("at", "id")
