from django.urls import path

from .views import (
    ProjectDetailView,
    ProjectListView,
    ProjectMemberDetailView,
    ProjectMemberListView,
)

urlpatterns = [
    path("projects", ProjectListView.as_view(), name="project-list"),
    path("projects/<str:slug>", ProjectDetailView.as_view(), name="project-detail"),
    path("projects/<str:slug>/members", ProjectMemberListView.as_view(), name="project-members"),
    path(
        "projects/<str:slug>/members/<str:username>",
        ProjectMemberDetailView.as_view(),
        name="project-member",
    ),
]
