from .models import AuditEvent


def audit_events(
    *,
    target_type: str = "",
    target_id: str = "",
    action: str = "",
    actor: str = "",
    correlation_id: str = "",
):
    events = AuditEvent.objects.all()
    if target_type:
        events = events.filter(target_type=target_type)
    if target_id:
        events = events.filter(target_id=target_id)
    if action:
        events = events.filter(action=action)
    if actor:
        events = events.filter(actor_label=actor)
    if correlation_id:
        events = events.filter(correlation_id=correlation_id)
    return events
