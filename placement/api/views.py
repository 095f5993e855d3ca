"""Workloads through the API: thin views over the admission services (P1–P6)."""

import functools

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from audit.services import Actor
from fleets.rules import validate_choice
from tuneplane.api.permissions import require_admin
from tuneplane.api.query import query_flag
from tuneplane.api.schema import errors
from tuneplane.api.throttles import LogsThrottle
from tuneplane.errors import NotFound

from .. import logs
from ..choices import DeploymentState, JobState
from ..metrics import not_counted
from ..models import (
    Dataset,
    Deployment,
    Environment,
    LifecycleJob,
    PlaygroundSession,
    TrainingJob,
    Volume,
)
from ..selectors import (
    environment_resolve,
    queue_position,
    workloads_listed,
    workloads_shown_to,
    workloads_visible_to,
)
from ..services import runs, serving, storage, submission
from ..services.allocator import allocate_preview
from . import requests as bodies
from . import serializers as answers
from .schema import refusals


def seen_by(request) -> dict:
    return {"viewer": request.user}


def _list_filters(request, states) -> dict:
    """``?state=queued,running`` (or ``state`` repeated) and ``?project=<slug>``: each state
    one of ``states``, else a 400 naming ``state`` and the states it may be."""
    asked = [state for value in request.query_params.getlist("state") for state in value.split(",")]
    return {
        "states": [validate_choice("state", state, states) for state in asked],
        "project": request.query_params.get("project", ""),
    }


# What a dry run also shows the allocator's next pass for (Q7): work it places on node Fleets.
ALLOCATED = (TrainingJob, LifecycleJob, Deployment)


class WorkloadListView(GenericAPIView):
    """GET: the caller's projects' records; POST: admit one, or refuse with a reason."""

    model = None
    request_serializer = None
    # A model's state choices: its list then filters by ?state= and ?project=.
    states = None

    def submit(self, actor, data):
        raise NotImplementedError

    def get_queryset(self):
        return workloads_shown_to(self.request.user, self.model)

    def get(self, request):
        filters = {} if self.states is None else _list_filters(request, self.states)
        page = self.paginate_queryset(workloads_listed(request.user, self.model, **filters))
        return self.get_paginated_response(
            self.serializer_class(page, many=True, context=seen_by(request)).data
        )

    def post(self, request):
        dry_run = query_flag(request, "dry_run")  # before anything is read or written (Q7)
        incoming = self.request_serializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        if dry_run:
            return Response(self._dry_run(request, incoming.validated_data))
        record = self.submit(Actor.of_user(request.user), incoming.validated_data)
        shown = self.get_queryset().get(pk=record.pk)
        return Response(
            self.serializer_class(shown, context=seen_by(request)).data,
            status=status.HTTP_201_CREATED,
        )

    def _dry_run(self, request, data) -> dict:
        """Q7: what admission would decide and where it would queue, writing nothing: the
        submission runs, is shown, and is rolled back (its audit events and the tasks it
        would send with it)."""
        with transaction.atomic(), not_counted():
            record = self.submit(Actor.of_user(request.user), data)
            shown = self.serializer_class(
                self.get_queryset().get(pk=record.pk), context=seen_by(request)
            ).data
            queue = queue_position(record)
            allocation = allocate_preview(record) if isinstance(record, ALLOCATED) else None
            transaction.set_rollback(True)
        return {**shown, "id": None, "dry_run": True, "queue": queue, "allocation": allocation}


def _list_parameters(states) -> list[OpenApiParameter]:
    if states is None:
        return []
    return [
        OpenApiParameter(
            "state",
            str,
            enum=states.values,
            many=True,
            style="form",
            explode=False,
            description="Only records in these states, comma-separated; any other is a 400.",
        ),
        OpenApiParameter("project", description="Only this project's records, by slug."),
    ]


def documented(noun: str, request, response, *, refused=(404, 422)):
    def document(view):
        listed = extend_schema(
            methods=["GET"],
            summary=f"List {noun}s of your projects",
            parameters=_list_parameters(view.states),
            responses={
                200: response(many=True),
                **errors(*((401,) if view.states is None else (400, 401))),
            },
        )
        submitted = extend_schema(
            methods=["POST"],
            summary=f"Submit a {noun}: admitted to a Fleet, or refused",
            description="With `?dry_run=true`: 200 with what admission would decide and, for "
            "a job, where it would queue (`queue`); for a job or a deployment on a node Fleet, "
            "what the allocator's next pass would do (`allocation`: whether it `starts` and on "
            "which `nodes`, else why it would be `waiting` and which running jobs it "
            "`preempts`), writing nothing (Q7).",
            parameters=[OpenApiParameter("dry_run", bool, description="Decide; write nothing.")],
            request=request,
            responses={
                201: response,
                200: answers.dry_run_of(response),
                **refusals(400, 401, *refused),
            },
        )
        return listed(submitted(view))

    return document


@documented("training job", bodies.TrainingJobRequest, answers.TrainingJobSerializer)
class TrainingJobsView(WorkloadListView):
    model, states = TrainingJob, JobState
    serializer_class, request_serializer = answers.TrainingJobSerializer, bodies.TrainingJobRequest

    def submit(self, actor, data):
        return submission.training_job_submit(actor=actor, **data)


@documented("lifecycle job", bodies.LifecycleJobRequest, answers.LifecycleJobSerializer)
class LifecycleJobsView(WorkloadListView):
    model, serializer_class, states = LifecycleJob, answers.LifecycleJobSerializer, JobState
    request_serializer = bodies.LifecycleJobRequest

    def submit(self, actor, data):
        return submission.lifecycle_job_submit(actor=actor, **data)


@documented("deployment", bodies.DeploymentRequest, answers.DeploymentSerializer)
class DeploymentsView(WorkloadListView):
    model, serializer_class, states = Deployment, answers.DeploymentSerializer, DeploymentState
    request_serializer = bodies.DeploymentRequest

    def submit(self, actor, data):
        return submission.deployment_submit(actor=actor, **data)


class JobView(GenericAPIView):
    model = None

    def _job(self, request, job_id: int):
        """The job as its list shows it; one the caller may not see is not found, exactly as
        one that does not exist (F8)."""
        job = workloads_shown_to(request.user, self.model).filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"{self.model._meta.verbose_name.capitalize()} {job_id} not found.")
        return job


class JobDetailView(JobView):
    def get(self, request, job_id: int):
        return Response(
            self.serializer_class(self._job(request, job_id), context=seen_by(request)).data
        )


@extend_schema(
    summary="A training job: its state, attempts and members, as the list shows it",
    responses={200: answers.TrainingJobSerializer, **errors(401, 404)},
)
class TrainingJobDetailView(JobDetailView):
    model, serializer_class = TrainingJob, answers.TrainingJobSerializer


@extend_schema(
    summary="A lifecycle job: its state, attempts and members, as the list shows it",
    responses={200: answers.LifecycleJobSerializer, **errors(401, 404)},
)
class LifecycleJobDetailView(JobDetailView):
    model, serializer_class = LifecycleJob, answers.LifecycleJobSerializer


class JobCancelView(JobView):
    """R10: a queued job is cancelled at once; a running one is stopped, then cleaned up."""

    def post(self, request, job_id: int):
        runs.job_cancel(actor=Actor.of_user(request.user), job=self._job(request, job_id))
        return Response(
            self.serializer_class(self._job(request, job_id), context=seen_by(request)).data
        )


@extend_schema(
    summary="Cancel a training job (R10)",
    request=None,
    responses={200: answers.TrainingJobSerializer, **errors(401, 404, 409)},
)
class TrainingJobCancelView(JobCancelView):
    model, serializer_class = TrainingJob, answers.TrainingJobSerializer


@extend_schema(
    summary="Cancel a lifecycle job (R10)",
    request=None,
    responses={200: answers.LifecycleJobSerializer, **errors(401, 404, 409)},
)
class LifecycleJobCancelView(JobCancelView):
    model, serializer_class = LifecycleJob, answers.LifecycleJobSerializer


class JobExcludedClearView(JobView):
    """H2: an administrator clears what the job's next attempts stay away from."""

    def post(self, request, job_id: int):
        job = self._job(request, job_id)
        require_admin(request, "clear a job's excluded nodes and cards")
        runs.job_excluded_clear(actor=Actor.of_user(request.user), job=job)
        return Response(
            self.serializer_class(self._job(request, job_id), context=seen_by(request)).data
        )


@extend_schema(
    summary="Clear a training job's excluded nodes and cards (H2; administrators)",
    request=None,
    responses={200: answers.TrainingJobSerializer, **errors(401, 403, 404)},
)
class TrainingJobExcludedClearView(JobExcludedClearView):
    model, serializer_class = TrainingJob, answers.TrainingJobSerializer


@extend_schema(
    summary="Clear a lifecycle job's excluded nodes and cards (H2; administrators)",
    request=None,
    responses={200: answers.LifecycleJobSerializer, **errors(401, 403, 404)},
)
class LifecycleJobExcludedClearView(JobExcludedClearView):
    model, serializer_class = LifecycleJob, answers.LifecycleJobSerializer


class JobLogsView(JobView):
    """One member's output, its tail or from an offset on, read from its node now: logs stay
    on the node."""

    throttle_classes = [LogsThrottle]

    def get(self, request, job_id: int):
        job = self._job(request, job_id)
        incoming = bodies.LogsQuery(data=request.query_params)
        incoming.is_valid(raise_exception=True)
        query = incoming.validated_data
        member = logs.job_member(job=job, attempt=query["attempt"], rank=query["rank"])
        read = logs.member_output(
            member=member, tail_bytes=query["tail_bytes"], offset=query["offset"]
        )
        return Response(
            {
                "attempt": member.attempt.number,
                "rank": member.rank,
                "node": member.node_id,
                **logs.shown(read, query["tail_bytes"]),
            }
        )


def _logs_documented(noun, view):
    return extend_schema(
        summary=f"A {noun} member's output, its tail or from `offset` on, fetched from its "
        "node now",
        parameters=[bodies.LogsQuery],
        responses={200: answers.LogsSerializer, **errors(400, 401, 404, 429, 503)},
    )(view)


@functools.partial(_logs_documented, "training job's")
class TrainingJobLogsView(JobLogsView):
    model = TrainingJob


@functools.partial(_logs_documented, "lifecycle job's")
class LifecycleJobLogsView(JobLogsView):
    model = LifecycleJob


class DeploymentView(GenericAPIView):
    serializer_class = answers.DeploymentSerializer

    def _deployment(self, request, deployment_id: int) -> Deployment:
        found = workloads_shown_to(request.user, Deployment).filter(pk=deployment_id).first()
        if found is None:
            raise NotFound(f"Deployment {deployment_id} not found.")
        return found


class DeploymentDetailView(DeploymentView):
    @extend_schema(
        summary="A deployment, with its revisions and whether each is Ready",
        responses={200: answers.DeploymentSerializer, **errors(401, 404)},
    )
    def get(self, request, deployment_id: int):
        return Response(
            answers.DeploymentSerializer(
                self._deployment(request, deployment_id), context=seen_by(request)
            ).data
        )

    @extend_schema(
        summary="Stop a deployment; its Fleet never changes (P2)",
        request=bodies.DeploymentUpdateRequest,
        responses={200: answers.DeploymentSerializer, **errors(400, 401, 404)},
    )
    def patch(self, request, deployment_id: int):
        deployment = self._deployment(request, deployment_id)
        incoming = bodies.DeploymentUpdateRequest(data=request.data)
        incoming.is_valid(raise_exception=True)
        serving.deployment_update(
            actor=Actor.of_user(request.user), deployment=deployment, **incoming.validated_data
        )
        return Response(
            answers.DeploymentSerializer(
                self._deployment(request, deployment_id), context=seen_by(request)
            ).data
        )


class DeploymentRevisionsView(DeploymentView):
    @extend_schema(
        summary="Roll out a new revision (S2): its replicas start beside the old ones; each "
        "old one stops only when a new one is Ready; not Ready within the deadline: rolled back",
        request=bodies.RevisionRequest,
        responses={201: answers.DeploymentSerializer, **errors(400, 401, 404, 409)},
    )
    def post(self, request, deployment_id: int):
        deployment = self._deployment(request, deployment_id)
        incoming = bodies.RevisionRequest(data=request.data)
        incoming.is_valid(raise_exception=True)
        serving.revision_create(
            actor=Actor.of_user(request.user), deployment=deployment, **incoming.validated_data
        )
        return Response(
            answers.DeploymentSerializer(
                self._deployment(request, deployment_id), context=seen_by(request)
            ).data,
            status=status.HTTP_201_CREATED,
        )


@documented("playground session", bodies.PlaygroundRequest, answers.PlaygroundSessionSerializer)
class PlaygroundSessionsView(WorkloadListView):
    model, serializer_class = PlaygroundSession, answers.PlaygroundSessionSerializer
    states = DeploymentState
    request_serializer = bodies.PlaygroundRequest

    def submit(self, actor, data):
        return submission.playground_session_submit(actor=actor, **data)


@documented("environment", bodies.EnvironmentRequest, answers.EnvironmentSerializer)
class EnvironmentsView(WorkloadListView):
    model, serializer_class = Environment, answers.EnvironmentSerializer
    request_serializer = bodies.EnvironmentRequest

    def submit(self, actor, data):
        return submission.environment_submit(actor=actor, **data)


class EnvironmentResolveView(GenericAPIView):
    serializer_class = answers.EnvironmentSerializer

    @extend_schema(
        summary="The address of a node of the environment's Fleet answering now "
        "(P5, L3); never cached",
        request=None,
        responses={200: dict, **refusals(401, 404, 422)},
    )
    def post(self, request, environment_id: int):
        environment = (
            workloads_visible_to(request.user, Environment).filter(pk=environment_id).first()
        )
        if environment is None:
            raise NotFound(f"Environment {environment_id} not found.")
        node = environment_resolve(environment)
        return Response(
            {
                "environment": environment.pk,
                "fleet": environment.fleet_id,
                "node": node.id,
                "address": node.address,
            }
        )


@documented("volume", bodies.StorageRequest, answers.StorageSerializer, refused=(404,))
class VolumesView(WorkloadListView):
    model, serializer_class, request_serializer = (
        Volume,
        answers.StorageSerializer,
        bodies.StorageRequest,
    )

    def submit(self, actor, data):
        return storage.storage_create(Volume, actor=actor, **data)


@documented("dataset", bodies.StorageRequest, answers.DatasetSerializer, refused=(404,))
class DatasetsView(VolumesView):
    model, serializer_class = Dataset, answers.DatasetSerializer

    def submit(self, actor, data):
        return storage.storage_create(Dataset, actor=actor, **data)
