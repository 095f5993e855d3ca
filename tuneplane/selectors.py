from .errors import ValidationFailed
from .models import Project


def project_by_slug(slug: str | None, *, field: str = "project") -> Project | None:
    if slug is None:
        return None
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise ValidationFailed(f"{field}: no project '{slug[:80]}'.", field=field)
    return project
