"""Projects and memberships, for administrators: thin views over tuneplane.services."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from audit.services import Actor

from .. import services
from ..errors import ValidationFailed
from ..selectors import membership_get, project_get, projects_with_members, user_by_username
from .permissions import IsAdmin
from .schema import errors
from .serializers import (
    MemberAddSerializer,
    ProjectCreateSerializer,
    ProjectSerializer,
    ProjectUpdateSerializer,
)


class ProjectListView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = ProjectSerializer

    @extend_schema(
        summary="List projects with their members (administrators)",
        responses={200: ProjectSerializer(many=True), **errors(401, 403)},
    )
    def get(self, request):
        page = self.paginate_queryset(projects_with_members())
        return self.get_paginated_response(ProjectSerializer(page, many=True).data)

    @extend_schema(
        summary="Make a project (administrators)",
        request=ProjectCreateSerializer,
        responses={201: ProjectSerializer, **errors(400, 401, 403, 409)},
    )
    def post(self, request):
        serializer = ProjectCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = services.project_create(
            actor=Actor.of_user(request.user), **serializer.validated_data
        )
        return Response(
            ProjectSerializer(project_get(project.slug)).data, status=status.HTTP_201_CREATED
        )


class ProjectDetailView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = ProjectSerializer

    @extend_schema(
        summary="A project and its members (administrators)",
        responses={200: ProjectSerializer, **errors(401, 403, 404)},
    )
    def get(self, request, slug: str):
        return Response(ProjectSerializer(project_get(slug)).data)

    @extend_schema(
        summary="Rename a project or change its max_priority (administrators)",
        request=ProjectUpdateSerializer,
        responses={200: ProjectSerializer, **errors(400, 401, 403, 404)},
    )
    def patch(self, request, slug: str):
        project = project_get(slug)
        serializer = ProjectUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        if changes.pop("slug", project.slug) != project.slug:
            raise ValidationFailed(
                "slug: a project's slug is fixed once made; workloads name it.", field="slug"
            )
        services.project_update(actor=Actor.of_user(request.user), project=project, **changes)
        return Response(ProjectSerializer(project_get(slug)).data)


class ProjectMemberListView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = ProjectSerializer

    @extend_schema(
        summary="Add a member to a project (administrators); adding one twice changes nothing",
        request=MemberAddSerializer,
        responses={201: ProjectSerializer, **errors(400, 401, 403, 404)},
    )
    def post(self, request, slug: str):
        project = project_get(slug)
        serializer = MemberAddSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = user_by_username(serializer.validated_data["username"])
        services.membership_add(actor=Actor.of_user(request.user), project=project, user=user)
        return Response(ProjectSerializer(project_get(slug)).data, status=status.HTTP_201_CREATED)


class ProjectMemberDetailView(GenericAPIView):
    permission_classes = [IsAdmin]
    serializer_class = ProjectSerializer

    @extend_schema(
        summary="Remove a member from a project (administrators)",
        responses={204: None, **errors(401, 403, 404)},
    )
    def delete(self, request, slug: str, username: str):
        membership = membership_get(project_get(slug), username)
        services.membership_remove(actor=Actor.of_user(request.user), membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)
