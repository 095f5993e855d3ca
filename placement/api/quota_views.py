"""A Fleet's quotas (Q1): ``GET`` and ``PUT /api/fleets/{id}/quotas``."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.services import Actor
from fleets.selectors import fleet_get_visible
from tuneplane.api.permissions import require_admin
from tuneplane.api.schema import errors
from tuneplane.models import Project
from tuneplane.permissions import is_admin

from ..services.quotas import QuotaSpec, quota_rows, quotas_replace
from .requests import QuotasRequest
from .serializers import QuotasSerializer


class FleetQuotasView(APIView):
    serializer_class = QuotasSerializer

    @extend_schema(
        summary="A Fleet's quotas, with what each holds, borrows and has queued (Q1)",
        description="Administrators see every project's; a member, those of its projects.",
        responses={200: QuotasSerializer, **errors(401, 404)},
    )
    def get(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        mine = None if is_admin(request.user) else Project.objects.filter(members=request.user)
        return Response(QuotasSerializer({"quotas": quota_rows(fleet, mine)}).data)

    @extend_schema(
        summary="Replace a Fleet's quotas as a whole (administrators; Q1)",
        request=QuotasRequest,
        responses={200: QuotasSerializer, **errors(400, 401, 403, 404)},
    )
    def put(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        require_admin(request, "set quotas")
        body = QuotasRequest(data=request.data)
        body.is_valid(raise_exception=True)
        specs = [QuotaSpec(**row) for row in body.validated_data["quotas"]]
        quotas_replace(actor=Actor.of_user(request.user), fleet=fleet, specs=specs)
        return Response(QuotasSerializer({"quotas": quota_rows(fleet)}).data)
