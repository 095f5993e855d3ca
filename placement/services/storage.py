"""Volumes and datasets: a project's records of storage, never placed (P3)."""

from django.db import transaction

from audit.services import Actor, audit_record
from tuneplane.errors import ValidationFailed

from .submission import project_for


def storage_create(model, *, actor: Actor, project: str, name: str, uri: str = ""):
    """Volumes and datasets are records of storage: never placed (P3)."""
    project_record = project_for(actor.user, project)
    with transaction.atomic():
        if model.objects.filter(project=project_record, name=name).exists():
            raise ValidationFailed(
                f"name: project '{project}' already has a {model._meta.verbose_name} '{name}'.",
                field="name",
            )
        record = model.objects.create(project=project_record, name=name, uri=uri)
        audit_record(
            actor=actor,
            action=f"{model._meta.model_name}.created",
            target=record,
            after={"project": project, "name": name, "uri": uri},
        )
    return record
