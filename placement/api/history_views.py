"""A record's history through the API (``.../events``): thin views over placement.history.
Who may see the record may read its history; for anyone else it is not found, exactly as a
record that does not exist (F8)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import GenericAPIView

from audit.api.serializers import AuditEventSerializer
from tuneplane.api.schema import errors
from tuneplane.errors import NotFound

from ..disclosure import event_shown
from ..history import record_history
from ..models import Deployment, Environment, LifecycleJob, PlaygroundSession, TrainingJob
from ..selectors import projects_read_by, workloads_visible_to


class HistoryEventSerializer(AuditEventSerializer):
    """An event as the record's reader reads it: a preemption's names other projects' work
    only as "another project's work" (R23, placement.disclosure); administrators read all."""

    reason = serializers.SerializerMethodField(help_text="Why, when the change says: its reason.")

    class Meta(AuditEventSerializer.Meta):
        fields = [*AuditEventSerializer.Meta.fields, "reason"]
        read_only_fields = fields

    def get_reason(self, event) -> str:
        return str((event.after or {}).get("reason") or "")

    def to_representation(self, event):
        data = super().to_representation(event)
        context = self.context
        if "sees" not in context:
            context["sees"] = projects_read_by(context.get("viewer"))
        data["after"] = event_shown(event.action, data["after"], context["sees"])
        return data


def _visible(request, model, pk: int):
    found = workloads_visible_to(request.user, model).filter(pk=pk).first()
    if found is None:
        raise NotFound(f"{model._meta.verbose_name.capitalize()} {pk} not found.")
    return found


class HistoryView(GenericAPIView):
    """The events of the record ``record(request, **kwargs)`` finds, a page at a time."""

    serializer_class = HistoryEventSerializer
    model = None

    def record(self, request, pk: int):
        return _visible(request, self.model, pk)

    def get(self, request, **kwargs):
        page = self.paginate_queryset(record_history(self.record(request, *kwargs.values())))
        shown = HistoryEventSerializer(page, many=True, context={"viewer": request.user})
        return self.get_paginated_response(shown.data)


def _documented(noun: str, parts: str):
    return extend_schema(
        summary=f"A {noun}'s history: the audit events of it and its {parts}, oldest first",
        responses={200: HistoryEventSerializer(many=True), **errors(401, 404)},
    )


@_documented("training job", "attempts and their members")
class TrainingJobEventsView(HistoryView):
    model = TrainingJob


@_documented("lifecycle job", "attempts and their members")
class LifecycleJobEventsView(HistoryView):
    model = LifecycleJob


@_documented("deployment", "revisions and their replicas")
class DeploymentEventsView(HistoryView):
    model = Deployment


@_documented("playground session", "process")
class PlaygroundSessionEventsView(HistoryView):
    model = PlaygroundSession


@_documented("episode", "process")
class EpisodeEventsView(HistoryView):
    def record(self, request, environment_id: int, number: int):
        environment = _visible(request, Environment, environment_id)
        episode = environment.episodes.filter(number=number).first()
        if episode is None:
            raise NotFound(f"Episode {number} of environment {environment_id} not found.")
        return episode
