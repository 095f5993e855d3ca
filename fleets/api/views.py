from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from audit.services import Actor
from tuneplane.api.permissions import require_admin
from tuneplane.api.schema import errors
from tuneplane.selectors import project_by_slug

from .. import rules, services
from ..choices import FleetKind, FleetState, FleetVisibility
from ..selectors import fleet_get_visible, fleets_visible_to
from .serializers import (
    FleetCreateSerializer,
    FleetSerializer,
    FleetUpdateSerializer,
    FleetWriteResultSerializer,
)

_LIST_FILTERS = {"kind": FleetKind, "state": FleetState, "visibility": FleetVisibility}


def _service_arguments(data: dict) -> dict:
    """Serializer output → service keywords; the project arrives by slug."""
    arguments = dict(data)
    if "project" in arguments:
        arguments["project"] = project_by_slug(arguments["project"])
    return arguments


def _seen_by(request) -> dict:
    return {"viewer": request.user}


class FleetListView(GenericAPIView):
    serializer_class = FleetSerializer

    @extend_schema(
        summary="List the Fleets you can see",
        parameters=[
            OpenApiParameter(name, enum=choices.values) for name, choices in _LIST_FILTERS.items()
        ]
        + [OpenApiParameter("project", description="Project slug")],
        responses={200: FleetSerializer(many=True), **errors(400, 401)},
    )
    def get(self, request):
        fleets = fleets_visible_to(request.user)
        for name, choices in _LIST_FILTERS.items():
            value = request.query_params.get(name)
            if value is not None:
                fleets = fleets.filter(**{name: rules.validate_choice(name, value, choices)})
        if request.query_params.get("project"):
            fleets = fleets.filter(project__slug=request.query_params["project"])
        page = self.paginate_queryset(fleets)
        return self.get_paginated_response(
            FleetSerializer(page, many=True, context=_seen_by(request)).data
        )

    @extend_schema(
        summary="Register a Fleet (administrators)",
        request=FleetCreateSerializer,
        responses={201: FleetWriteResultSerializer, **errors(400, 401, 403, 409, 413)},
    )
    def post(self, request):
        require_admin(request, "register Fleets")
        serializer = FleetCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        fleet = services.fleet_create(
            actor=Actor.of_user(request.user), **_service_arguments(serializer.validated_data)
        )
        return Response(
            FleetWriteResultSerializer(fleet, context=_seen_by(request)).data,
            status=status.HTTP_201_CREATED,
        )


class FleetDetailView(GenericAPIView):
    serializer_class = FleetSerializer

    @extend_schema(summary="A Fleet", responses={200: FleetSerializer, **errors(401, 404)})
    def get(self, request, fleet_id: str):
        return Response(
            FleetSerializer(
                fleet_get_visible(request.user, fleet_id), context=_seen_by(request)
            ).data
        )

    @extend_schema(
        summary="Change a Fleet (administrators)",
        request=FleetUpdateSerializer,
        responses={200: FleetWriteResultSerializer, **errors(400, 401, 403, 404, 413)},
    )
    def patch(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        require_admin(request, "change Fleets")
        serializer = FleetUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        arguments = _service_arguments(serializer.validated_data)
        requested_id = arguments.pop("id", fleet.id)
        rules.refuse_change("id", fleet.id, requested_id)
        fleet = services.fleet_update(actor=Actor.of_user(request.user), fleet=fleet, **arguments)
        return Response(FleetWriteResultSerializer(fleet, context=_seen_by(request)).data)

    @extend_schema(
        summary="Delete a Fleet (administrators; rule F7)",
        responses={204: None, **errors(401, 403, 404, 409)},
    )
    def delete(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        require_admin(request, "delete Fleets")
        services.fleet_delete(actor=Actor.of_user(request.user), fleet=fleet)
        return Response(status=status.HTTP_204_NO_CONTENT)
