from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.generics import GenericAPIView

from tuneplane.api.permissions import IsAdmin
from tuneplane.api.schema import errors

from ..selectors import audit_events
from .serializers import AuditEventSerializer

_FILTERS = ["target_type", "target_id", "action", "actor", "correlation_id"]


class AuditEventListView(GenericAPIView):
    """The audit log, newest first. Read-only here and everywhere (A1)."""

    permission_classes = [IsAdmin]
    serializer_class = AuditEventSerializer

    @extend_schema(
        summary="Read the audit log (administrators)",
        parameters=[OpenApiParameter(name) for name in _FILTERS],
        responses={200: AuditEventSerializer(many=True), **errors(401, 403)},
    )
    def get(self, request):
        events = audit_events(**{name: request.query_params.get(name, "") for name in _FILTERS})
        page = self.paginate_queryset(events)
        return self.get_paginated_response(AuditEventSerializer(page, many=True).data)
