"""Playground sessions ended early, and an environment's episodes (S4, S5): thin views over
placement.services.playground and .episodes."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from audit.services import Actor
from tuneplane.api.schema import errors
from tuneplane.api.throttles import LogsThrottle
from tuneplane.errors import NotFound

from .. import logs
from ..models import Deployment, Environment, Episode, PlaygroundSession
from ..selectors import workloads_shown_to, workloads_visible_to
from ..services import episodes, playground
from . import requests as bodies
from . import serializers as answers
from .views import seen_by


class PlaygroundSessionDetailView(GenericAPIView):
    serializer_class = answers.PlaygroundSessionSerializer

    def _session(self, request, session_id: int) -> PlaygroundSession:
        found = workloads_shown_to(request.user, PlaygroundSession).filter(pk=session_id).first()
        if found is None:
            raise NotFound(f"Playground session {session_id} not found.")
        return found

    def _shown(self, request, session_id: int) -> Response:
        session = self._session(request, session_id)
        return Response(answers.PlaygroundSessionSerializer(session, context=seen_by(request)).data)

    @extend_schema(
        summary="A playground session: its process, Ready, its address once Ready",
        responses={200: answers.PlaygroundSessionSerializer, **errors(401, 404)},
    )
    def get(self, request, session_id: int):
        return self._shown(request, session_id)

    @extend_schema(
        summary="End a playground session now (S4): stopped, then cleaned up",
        responses={200: answers.PlaygroundSessionSerializer, **errors(401, 404, 409)},
    )
    def delete(self, request, session_id: int):
        playground.session_end(
            actor=Actor.of_user(request.user), session=self._session(request, session_id)
        )
        return self._shown(request, session_id)


def _environment(request, environment_id: int) -> Environment:
    found = workloads_visible_to(request.user, Environment).filter(pk=environment_id).first()
    if found is None:
        raise NotFound(f"Environment {environment_id} not found.")
    return found


def _episodes(environment):
    return environment.episodes.prefetch_related("members").order_by("-number")


class EpisodesView(GenericAPIView):
    serializer_class = answers.EpisodeSerializer

    @extend_schema(
        summary="An environment's episodes, newest first",
        responses={200: answers.EpisodeSerializer(many=True), **errors(401, 404)},
    )
    def get(self, request, environment_id: int):
        page = self.paginate_queryset(_episodes(_environment(request, environment_id)))
        return self.get_paginated_response(
            answers.EpisodeSerializer(page, many=True, context=seen_by(request)).data
        )

    @extend_schema(
        summary="Start an episode (S5): on a node of the environment's Fleet answering for "
        "env now, ended by its exit or its own timeout",
        request=bodies.EpisodeRequest,
        responses={201: answers.EpisodeSerializer, **errors(400, 401, 404, 409)},
    )
    def post(self, request, environment_id: int):
        environment = _environment(request, environment_id)
        incoming = bodies.EpisodeRequest(data=request.data)
        incoming.is_valid(raise_exception=True)
        episode = episodes.episode_start(
            actor=Actor.of_user(request.user), environment=environment, **incoming.validated_data
        )
        shown = _episodes(environment).get(pk=episode.pk)
        return Response(
            answers.EpisodeSerializer(shown, context=seen_by(request)).data,
            status=status.HTTP_201_CREATED,
        )


def _episode(request, environment_id: int, number: int) -> Episode:
    found = _episodes(_environment(request, environment_id)).filter(number=number).first()
    if found is None:
        raise NotFound(f"Episode {number} of environment {environment_id} not found.")
    return found


class EpisodeDetailView(GenericAPIView):
    serializer_class = answers.EpisodeSerializer

    @extend_schema(
        summary="An episode: state, exit code, duration",
        responses={200: answers.EpisodeSerializer, **errors(401, 404)},
    )
    def get(self, request, environment_id: int, number: int):
        return Response(
            answers.EpisodeSerializer(
                _episode(request, environment_id, number), context=seen_by(request)
            ).data
        )


class EpisodeCancelView(GenericAPIView):
    serializer_class = answers.EpisodeSerializer

    @extend_schema(
        summary="Cancel a queued or running episode (S5); its process is stopped and cleaned",
        request=None,
        responses={200: answers.EpisodeSerializer, **errors(401, 404, 409)},
    )
    def post(self, request, environment_id: int, number: int):
        episode = _episode(request, environment_id, number)
        episodes.episode_cancel(actor=Actor.of_user(request.user), episode=episode)
        return Response(
            answers.EpisodeSerializer(
                _episode(request, environment_id, number), context=seen_by(request)
            ).data
        )


class EpisodeLogsSerializer(answers.OutputSerializer):
    number = serializers.IntegerField()


class EpisodeLogsView(GenericAPIView):
    throttle_classes = [LogsThrottle]
    serializer_class = EpisodeLogsSerializer

    @extend_schema(
        summary="An episode's output, its tail or from `offset` on, fetched from its node now",
        parameters=[bodies.TailQuery],
        responses={200: EpisodeLogsSerializer, **errors(400, 401, 404, 429, 503)},
    )
    def get(self, request, environment_id: int, number: int):
        episode = _episode(request, environment_id, number)
        incoming = bodies.TailQuery(data=request.query_params)
        incoming.is_valid(raise_exception=True)
        query = incoming.validated_data
        member = logs.episode_member(episode=episode)
        read = logs.member_output(
            member=member, tail_bytes=query["tail_bytes"], offset=query["offset"]
        )
        return Response(
            {
                "number": episode.number,
                "node": member.node_id,
                **logs.shown(read, query["tail_bytes"]),
            }
        )


class ReplicaLogsSerializer(answers.OutputSerializer):
    revision = serializers.IntegerField()
    replica = serializers.IntegerField()


class DeploymentLogsView(GenericAPIView):
    throttle_classes = [LogsThrottle]
    serializer_class = ReplicaLogsSerializer

    @extend_schema(
        summary="A replica's output, its tail or from `offset` on, fetched from its node now",
        parameters=[bodies.ReplicaLogsQuery],
        responses={200: ReplicaLogsSerializer, **errors(400, 401, 404, 429, 503)},
    )
    def get(self, request, deployment_id: int):
        deployment = workloads_visible_to(request.user, Deployment).filter(pk=deployment_id).first()
        if deployment is None:
            raise NotFound(f"Deployment {deployment_id} not found.")
        incoming = bodies.ReplicaLogsQuery(data=request.query_params)
        incoming.is_valid(raise_exception=True)
        query = incoming.validated_data
        member = logs.replica_member(
            deployment=deployment, revision=query["revision"], replica=query["replica"]
        )
        read = logs.member_output(
            member=member, tail_bytes=query["tail_bytes"], offset=query["offset"]
        )
        return Response(
            {
                "revision": member.revision.number,
                "replica": member.rank,
                "node": member.node_id,
                **logs.shown(read, query["tail_bytes"]),
            }
        )
