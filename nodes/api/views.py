import logging

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from audit.services import Actor
from fleets.selectors import fleet_get_visible
from tuneplane.api.permissions import IsAdmin, require_admin
from tuneplane.api.query import query_flag
from tuneplane.api.schema import errors
from tuneplane.api.throttles import WindowThrottle
from tuneplane.client_address import client_address
from tuneplane.errors import NotFound

from ..health_shown import health_breaker_of
from ..models import JoinToken
from ..selectors import (
    addresses_shared,
    card_series,
    join_tokens_of,
    live_sessions_of,
    nodes_visible_to,
    work_left_on,
)
from ..services import commands, cordons, drains, health, join, removal
from ..services.join import join_commands
from ..telemetry_shown import telemetry_of
from .health import HealthBreakerSerializer
from .serializers import (
    CommandRequestSerializer,
    CommandSerializer,
    CordonRequestSerializer,
    DrainRequestSerializer,
    FleetDrainResultSerializer,
    JoinRequestSerializer,
    JoinResponseSerializer,
    JoinTokenSerializer,
    MintedJoinTokenSerializer,
    NodeSerializer,
)

logger = logging.getLogger("tuneplane.nodes")


class FleetJoinTokensView(GenericAPIView):
    serializer_class = JoinTokenSerializer

    @extend_schema(
        summary="List a Fleet's join tokens, without secrets (administrators)",
        responses={200: JoinTokenSerializer(many=True), **errors(401, 403, 404)},
    )
    def get(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        require_admin(request, "see join tokens")
        page = self.paginate_queryset(join_tokens_of(fleet))
        return self.get_paginated_response(JoinTokenSerializer(page, many=True).data)

    @extend_schema(
        summary="Mint a join token; the token is shown in this response only",
        request=None,
        responses={201: MintedJoinTokenSerializer, **errors(401, 403, 404, 409)},
    )
    def post(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        require_admin(request, "mint join tokens")
        token, secret = join.join_token_mint(actor=Actor.of_user(request.user), fleet=fleet)
        body = {
            "id": token.pk,
            "fleet": fleet.id,
            "token": secret,
            "expires_at": token.expires_at,
            **join_commands(fleet.id, secret),
        }
        response = Response(MintedJoinTokenSerializer(body).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


class JoinTokenDetailView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = JoinTokenSerializer

    @extend_schema(
        summary="Revoke a join token (administrators)",
        responses={200: JoinTokenSerializer, **errors(401, 403, 404)},
    )
    def delete(self, request, token_id: int):
        token = JoinToken.objects.filter(pk=token_id).first()
        if token is None:
            raise NotFound(f"Join token {token_id} not found.")
        token = join.join_token_revoke(actor=Actor.of_user(request.user), token=token)
        return Response(JoinTokenSerializer(token).data)


class JoinThrottle(WindowThrottle):
    """Per client address (tuneplane.client_address: the peer, never a header a client
    writes unless a trusted proxy wrote it), so tokens cannot be guessed at speed
    (TUNEPLANE_JOIN_RATE)."""

    scope = "node-join"

    def get_rate(self):
        return settings.TUNEPLANE_JOIN_RATE

    def counted_by(self, request):
        return client_address(request)


class NodeJoinView(GenericAPIView):
    """The join token is the whole authorization; callers are throttled per address."""

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [JoinThrottle]
    serializer_class = JoinRequestSerializer

    @extend_schema(
        summary="Join a node Fleet with a join token",
        request=JoinRequestSerializer,
        responses={201: JoinResponseSerializer, **errors(400, 403, 413, 429)},
    )
    def post(self, request):
        serializer = JoinRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        result = join.node_join(
            token=data["token"],
            fleet_id=data["fleet"],
            csr=data["csr"],
            inventory=data["inventory"],
            address=data["address"],
            hostname=data["hostname"],
            fingerprint=data["fingerprint"],
            agent_version=data["agent_version"],
            client_address=client_address(request),
        )
        body = {
            "node_id": result.node.id,
            "fleet": result.node.fleet_id,
            "certificate": result.certificate.pem,
            "ca_bundle": result.ca_bundle,
            "credential_expires_at": result.certificate.not_after,
            "gateway_target": settings.TUNEPLANE_GATEWAY_TARGET,
            "warnings": result.warnings,
        }
        response = Response(body, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


def _node_context(nodes) -> dict:
    return {
        "card_series": card_series(name for node in nodes for name in node.card_names()),
        "shared_addresses": addresses_shared(nodes),
        "live_sessions": live_sessions_of(nodes),
        "work_left": work_left_on(node.pk for node in nodes if node.drain_started_at),
        "telemetry": telemetry_of(node.pk for node in nodes),
        "now": timezone.now(),
    }


class NodeListView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = NodeSerializer

    @extend_schema(
        summary="List nodes (administrators)",
        responses={200: NodeSerializer(many=True), **errors(401, 403)},
    )
    def get(self, request):
        nodes = nodes_visible_to(request.user).prefetch_related("cordons")
        fleet = request.query_params.get("fleet")
        if fleet:
            nodes = nodes.filter(fleet_id=fleet)
        page = self.paginate_queryset(nodes)
        return self.get_paginated_response(
            NodeSerializer(page, many=True, context=_node_context(page)).data
        )


def _node(request, node_id: str):
    node = nodes_visible_to(request.user).filter(pk=node_id).first()
    if node is None:
        raise NotFound(f"Node '{node_id}' not found.")
    return node


def _shown(node_id: str, user) -> Response:
    node = nodes_visible_to(user).prefetch_related("cordons").get(pk=node_id)
    return Response(NodeSerializer(node, context=_node_context([node])).data)


class NodeDetailView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = NodeSerializer

    @extend_schema(
        summary="A node (administrators)", responses={200: NodeSerializer, **errors(401, 403, 404)}
    )
    def get(self, request, node_id: str):
        return _shown(_node(request, node_id).pk, request.user)

    @extend_schema(
        summary="Remove a drained node, or with force=true a gone one (D2, D3, D4)",
        parameters=[
            OpenApiParameter(
                "force", bool, description=("Remove a gone machine anyway; audited as forced.")
            )
        ],
        responses={200: NodeSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def delete(self, request, node_id: str):
        node = removal.node_remove(
            actor=Actor.of_user(request.user),
            node=_node(request, node_id),
            force=query_flag(request, "force"),
        )
        return _shown(node.pk, request.user)


class NodeCordonView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = CordonRequestSerializer

    @extend_schema(
        summary="Cordon a node: no new work, nothing stopped (D1)",
        request=CordonRequestSerializer,
        responses={200: NodeSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, node_id: str):
        node = _node(request, node_id)
        serializer = CordonRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        cordons.node_cordon(
            actor=Actor.of_user(request.user), node=node, reason=serializer.validated_data["reason"]
        )
        return _shown(node.pk, request.user)


class NodeUncordonView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = NodeSerializer

    @extend_schema(
        summary="Lift the operator's cordon (a storage cordon stays, L6)",
        description="A draining or drained node without an operator's cordon is a 409 "
        "naming resume, the verb that undoes a drain.",
        request=None,
        responses={200: NodeSerializer, **errors(401, 403, 404, 409)},
    )
    def post(self, request, node_id: str):
        node = cordons.node_uncordon(
            actor=Actor.of_user(request.user), node=_node(request, node_id)
        )
        return _shown(node.pk, request.user)


class NodeResumeView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = NodeSerializer

    @extend_schema(
        summary="Resume a draining or drained node: it takes new work again (D1)",
        description="Undoes a drain, audited as node.resumed with the drain it undid (Slurm's "
        "RESUME). Cordons stay: uncordon lifts the operator's. A node without a drain is "
        "left as it is; a removed one is a 409.",
        request=None,
        responses={200: NodeSerializer, **errors(401, 403, 404, 409)},
    )
    def post(self, request, node_id: str):
        node = drains.node_resume(actor=Actor.of_user(request.user), node=_node(request, node_id))
        return _shown(node.pk, request.user)


class NodeDrainView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = DrainRequestSerializer

    @extend_schema(
        summary="Drain a node: no new work; drained once nothing runs (D1)",
        description="A reason is required. Nothing is stopped at the optional deadline: "
        "past it the drain shows overdue, with the work left.",
        request=DrainRequestSerializer,
        responses={200: NodeSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, node_id: str):
        node = _node(request, node_id)
        serializer = DrainRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        drains.node_drain(actor=Actor.of_user(request.user), node=node, **serializer.validated_data)
        return _shown(node.pk, request.user)


class FleetDrainView(GenericAPIView):
    serializer_class = DrainRequestSerializer

    @extend_schema(
        summary="Drain every machine of a node Fleet with one reason (administrators; D1)",
        request=DrainRequestSerializer,
        responses={200: FleetDrainResultSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        require_admin(request, "drain a Fleet's machines")
        serializer = DrainRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        drained = drains.fleet_nodes_drain(
            actor=Actor.of_user(request.user), fleet=fleet, **serializer.validated_data
        )
        nodes = list(
            nodes_visible_to(request.user)
            .prefetch_related("cordons")
            .filter(pk__in=[node.pk for node in drained])
        )
        body = {
            "fleet": fleet.id,
            "nodes": NodeSerializer(nodes, many=True, context=_node_context(nodes)).data,
        }
        return Response(body)


class NodeCommandsView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = CommandSerializer

    @extend_schema(
        summary="A node's commands, newest first (administrators)",
        responses={200: CommandSerializer(many=True), **errors(401, 403, 404)},
    )
    def get(self, request, node_id: str):
        node = _node(request, node_id)
        page = self.paginate_queryset(node.commands.all())
        return self.get_paginated_response(CommandSerializer(page, many=True).data)

    @extend_schema(
        summary="Send a command to a node, delivered over its control stream",
        request=CommandRequestSerializer,
        responses={201: CommandSerializer, **errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, node_id: str):
        node = _node(request, node_id)
        serializer = CommandRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        command = commands.node_command_create(
            actor=Actor.of_user(request.user), node=node, **serializer.validated_data
        )
        return Response(CommandSerializer(command).data, status=status.HTTP_201_CREATED)


class NodeCardReturnView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = NodeSerializer

    @extend_schema(
        summary="Return a quarantined card to service (H6)",
        description="Audited as node.card_returned; the node's gpu-health cordon is lifted "
        "with it. A card that is not quarantined is a 409.",
        request=None,
        responses={200: NodeSerializer, **errors(401, 403, 404, 409)},
    )
    def post(self, request, node_id: str, uuid: str):
        node = _node(request, node_id)
        health.card_return(node_id=node.pk, uuid=uuid, actor=Actor.of_user(request.user))
        return _shown(node.pk, request.user)


class FleetHealthBreakerView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = HealthBreakerSerializer

    @extend_schema(
        summary="A Fleet's health breaker and its latest card faults (H7)",
        responses={200: HealthBreakerSerializer, **errors(401, 403, 404)},
    )
    def get(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        return Response(HealthBreakerSerializer(health_breaker_of(fleet.pk)).data)


class FleetHealthBreakerResetView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = HealthBreakerSerializer

    @extend_schema(
        summary="Reset a Fleet's tripped health breaker: automatic quarantine runs again (H7)",
        description="Audited as fleet.health_breaker_reset; quarantines before it no longer "
        "count. A breaker not tripped is a 409.",
        request=None,
        responses={200: HealthBreakerSerializer, **errors(401, 403, 404, 409)},
    )
    def post(self, request, fleet_id: str):
        fleet = fleet_get_visible(request.user, fleet_id)
        health.health_breaker_reset(fleet_id=fleet.pk, actor=Actor.of_user(request.user))
        return Response(HealthBreakerSerializer(health_breaker_of(fleet.pk)).data)
