"""The composition root: the only module that sees every app."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from nodes import views as node_views

from . import views
from .metrics import metrics_view

admin.site.site_header = "Tuneplane console"
admin.site.site_title = "Tuneplane"
admin.site.index_title = "Fleets, machines and the audit log"

api = [
    path("", include("fleets.api.urls")),
    path("", include("audit.api.urls")),
    path("", include("nodes.api.urls")),
    path("", include("placement.api.urls")),
    path("", include("tuneplane.api.urls")),
    path("schema", SpectacularAPIView.as_view(), name="schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", include(api)),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("install.sh", node_views.install_script, name="install-sh"),
    path("downloads/", node_views.download_index, name="downloads"),
    path("downloads/<str:filename>", node_views.download, name="download"),
]

handler404 = "tuneplane.views.not_found"
handler500 = "tuneplane.views.internal_error"
