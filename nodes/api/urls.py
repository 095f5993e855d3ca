from django.urls import path

from .hardware import (
    CardNameDetailView,
    CardNameListView,
    HardwareSeriesDetailView,
    HardwareSeriesListView,
)
from .views import (
    FleetDrainView,
    FleetHealthBreakerResetView,
    FleetHealthBreakerView,
    FleetJoinTokensView,
    JoinTokenDetailView,
    NodeCardReturnView,
    NodeCommandsView,
    NodeCordonView,
    NodeDetailView,
    NodeDrainView,
    NodeJoinView,
    NodeListView,
    NodeResumeView,
    NodeUncordonView,
)

urlpatterns = [
    path("hardware-series", HardwareSeriesListView.as_view(), name="hardware-series-list"),
    path(
        "hardware-series/<str:slug>",
        HardwareSeriesDetailView.as_view(),
        name="hardware-series-detail",
    ),
    path("card-names", CardNameListView.as_view(), name="card-name-list"),
    path("card-names/<int:card_id>", CardNameDetailView.as_view(), name="card-name-detail"),
    path(
        "fleets/<str:fleet_id>/join-tokens", FleetJoinTokensView.as_view(), name="fleet-join-tokens"
    ),
    path("fleets/<str:fleet_id>/drain", FleetDrainView.as_view(), name="fleet-drain"),
    path("join-tokens/<int:token_id>", JoinTokenDetailView.as_view(), name="join-token-detail"),
    path("nodes/join", NodeJoinView.as_view(), name="node-join"),
    path("nodes", NodeListView.as_view(), name="node-list"),
    path("nodes/<str:node_id>", NodeDetailView.as_view(), name="node-detail"),
    path("nodes/<str:node_id>/cordon", NodeCordonView.as_view(), name="node-cordon"),
    path("nodes/<str:node_id>/uncordon", NodeUncordonView.as_view(), name="node-uncordon"),
    path("nodes/<str:node_id>/drain", NodeDrainView.as_view(), name="node-drain"),
    path("nodes/<str:node_id>/resume", NodeResumeView.as_view(), name="node-resume"),
    path("nodes/<str:node_id>/commands", NodeCommandsView.as_view(), name="node-commands"),
    path(
        "nodes/<str:node_id>/cards/<str:uuid>/return",
        NodeCardReturnView.as_view(),
        name="node-card-return",
    ),
    path(
        "fleets/<str:fleet_id>/health-breaker",
        FleetHealthBreakerView.as_view(),
        name="fleet-health-breaker",
    ),
    path(
        "fleets/<str:fleet_id>/health-breaker/reset",
        FleetHealthBreakerResetView.as_view(),
        name="fleet-health-breaker-reset",
    ),
]
