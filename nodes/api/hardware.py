"""The hardware registry in the API (J4): series jobs pin, and card names mapped to them.
Members read it; administrators write it, each write through nodes.services.hardware
(validated, one transaction, audited), a mapping effective on every node at once."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from audit.services import Actor
from tuneplane.api.fields import StrictCharField, StrictSerializer
from tuneplane.api.permissions import require_admin
from tuneplane.api.query import query_flag
from tuneplane.api.schema import errors
from tuneplane.errors import NotFound, ValidationFailed

from ..models import CardAlias, HardwareSeries
from ..services import hardware


class HardwareSeriesSerializer(serializers.ModelSerializer):
    card_names = serializers.SerializerMethodField()

    class Meta:
        model = HardwareSeries
        fields = ["slug", "name", "vendor", "card_names"]
        read_only_fields = fields

    def get_card_names(self, series) -> list[str]:
        return sorted(alias.name for alias in series.aliases.all())


class SeriesCreateSerializer(StrictSerializer):
    slug = StrictCharField(max_length=63, help_text="What jobs pin, e.g. h100; fixed once made.")
    name = StrictCharField(max_length=200)
    vendor = StrictCharField(max_length=32, required=False, allow_blank=True, default="")

    class Meta:
        ref_name = "HardwareSeriesCreate"


class SeriesUpdateSerializer(StrictSerializer):
    read_only_names = ("card_names",)
    slug = StrictCharField(max_length=63, required=False)
    name = StrictCharField(max_length=200, required=False)
    vendor = StrictCharField(max_length=32, required=False, allow_blank=True)

    class Meta:
        ref_name = "HardwareSeriesUpdate"


class CardNameSerializer(serializers.ModelSerializer):
    series = serializers.CharField(
        source="series.slug",
        allow_null=True,
        default=None,
        help_text="null while no administrator has mapped it (J4)",
    )

    class Meta:
        model = CardAlias
        fields = ["id", "name", "series", "first_seen_at"]
        read_only_fields = fields


class CardNameCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=200, help_text="Exactly as machines or clusters report it.")
    series = StrictCharField(max_length=63, required=False, allow_null=True, default=None)

    class Meta:
        ref_name = "CardNameCreate"


class CardNameMapSerializer(StrictSerializer):
    read_only_names = ("id", "name", "first_seen_at")
    series = StrictCharField(max_length=63, allow_null=True, help_text="A series slug, or null.")

    class Meta:
        ref_name = "CardNameMap"


def _series(slug: str | None, field: str = "series") -> HardwareSeries | None:
    if slug is None:
        return None
    series = HardwareSeries.objects.filter(slug=slug).first()
    if series is None:
        raise ValidationFailed(f"{field}: no hardware series '{slug}'.", field=field)
    return series


def _series_or_404(slug: str) -> HardwareSeries:
    series = HardwareSeries.objects.prefetch_related("aliases").filter(slug=slug).first()
    if series is None:
        raise NotFound(f"Hardware series '{slug}' not found.")
    return series


def _card_name_or_404(card_id: int) -> CardAlias:
    alias = CardAlias.objects.select_related("series").filter(pk=card_id).first()
    if alias is None:
        raise NotFound(f"Card name {card_id} not found.")
    return alias


class HardwareSeriesListView(GenericAPIView):
    serializer_class = HardwareSeriesSerializer

    @extend_schema(
        summary="The hardware series jobs may pin, with the card names mapped to each",
        responses={200: HardwareSeriesSerializer(many=True), **errors(401)},
    )
    def get(self, request):
        page = self.paginate_queryset(HardwareSeries.objects.prefetch_related("aliases"))
        return self.get_paginated_response(HardwareSeriesSerializer(page, many=True).data)

    @extend_schema(
        summary="Add a hardware series (administrators)",
        request=SeriesCreateSerializer,
        responses={201: HardwareSeriesSerializer, **errors(400, 401, 403)},
    )
    def post(self, request):
        require_admin(request, "add hardware series")
        serializer = SeriesCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        series = hardware.series_create(
            actor=Actor.of_user(request.user), **serializer.validated_data
        )
        body = HardwareSeriesSerializer(_series_or_404(series.slug)).data
        return Response(body, status=status.HTTP_201_CREATED)


class HardwareSeriesDetailView(GenericAPIView):
    serializer_class = HardwareSeriesSerializer

    @extend_schema(
        summary="A hardware series", responses={200: HardwareSeriesSerializer, **errors(401, 404)}
    )
    def get(self, request, slug: str):
        return Response(HardwareSeriesSerializer(_series_or_404(slug)).data)

    @extend_schema(
        summary="Rename a hardware series (administrators; its slug is fixed)",
        request=SeriesUpdateSerializer,
        responses={200: HardwareSeriesSerializer, **errors(400, 401, 403, 404)},
    )
    def patch(self, request, slug: str):
        series = _series_or_404(slug)
        require_admin(request, "change hardware series")
        serializer = SeriesUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if data.get("slug", slug) != slug:
            raise ValidationFailed(
                "slug is fixed once a series is made: jobs pin it and nodes count cards "
                "under it. Add a new series and map the card names to it instead.",
                field="slug",
            )
        hardware.series_update(
            actor=Actor.of_user(request.user),
            series=series,
            name=data.get("name", series.name),
            vendor=data.get("vendor", series.vendor),
        )
        return Response(HardwareSeriesSerializer(_series_or_404(slug)).data)

    @extend_schema(
        summary="Delete a series no card name maps to (administrators)",
        responses={204: None, **errors(401, 403, 404, 409)},
    )
    def delete(self, request, slug: str):
        series = _series_or_404(slug)
        require_admin(request, "delete hardware series")
        hardware.series_delete(actor=Actor.of_user(request.user), series=series)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CardNameListView(GenericAPIView):
    serializer_class = CardNameSerializer

    @extend_schema(
        summary="Card names as machines and clusters report them, and their series",
        parameters=[
            OpenApiParameter("mapped", bool, description="Only mapped (true) or unmapped (false).")
        ],
        responses={200: CardNameSerializer(many=True), **errors(400, 401)},
    )
    def get(self, request):
        names = CardAlias.objects.select_related("series")
        if "mapped" in request.query_params:
            names = names.filter(series__isnull=not query_flag(request, "mapped"))
        page = self.paginate_queryset(names)
        return self.get_paginated_response(CardNameSerializer(page, many=True).data)

    @extend_schema(
        summary="Add a card name before any machine reports it (administrators)",
        request=CardNameCreateSerializer,
        responses={201: CardNameSerializer, **errors(400, 401, 403)},
    )
    def post(self, request):
        require_admin(request, "add card names")
        serializer = CardNameCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        alias = hardware.card_alias_add(
            actor=Actor.of_user(request.user),
            name=serializer.validated_data["name"],
            series=_series(serializer.validated_data["series"]),
        )
        return Response(CardNameSerializer(alias).data, status=status.HTTP_201_CREATED)


class CardNameDetailView(GenericAPIView):
    serializer_class = CardNameSerializer

    @extend_schema(summary="A card name", responses={200: CardNameSerializer, **errors(401, 404)})
    def get(self, request, card_id: int):
        return Response(CardNameSerializer(_card_name_or_404(card_id)).data)

    @extend_schema(
        summary="Map a card name to a series, or unmap it (administrators; J4)",
        description="Every node reporting the name follows at once, without a re-join.",
        request=CardNameMapSerializer,
        responses={200: CardNameSerializer, **errors(400, 401, 403, 404)},
    )
    def patch(self, request, card_id: int):
        alias = _card_name_or_404(card_id)
        require_admin(request, "map card names")
        serializer = CardNameMapSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        alias = hardware.card_alias_map(
            actor=Actor.of_user(request.user),
            alias=alias,
            series=_series(serializer.validated_data["series"]),
        )
        return Response(CardNameSerializer(_card_name_or_404(alias.pk)).data)

    @extend_schema(
        summary="Delete an unmapped card name (administrators)",
        responses={204: None, **errors(401, 403, 404, 409)},
    )
    def delete(self, request, card_id: int):
        alias = _card_name_or_404(card_id)
        require_admin(request, "delete card names")
        hardware.card_alias_delete(actor=Actor.of_user(request.user), alias=alias)
        return Response(status=status.HTTP_204_NO_CONTENT)
