from django.urls import path

from .views import FleetDetailView, FleetListView

urlpatterns = [
    path("fleets", FleetListView.as_view(), name="fleet-list"),
    path("fleets/<str:fleet_id>", FleetDetailView.as_view(), name="fleet-detail"),
]
