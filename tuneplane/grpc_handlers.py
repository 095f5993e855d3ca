"""The gRPC composition root (django-grpc-framework's ROOT_HANDLERS_HOOK): every servicer."""

import asyncio

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nodes.agent.proto import control_pb2_grpc
from nodes.gateway import Gateway, NodeControlService

SERVICE_NAMES = ["tuneplane.node.v1.NodeControl"]


def grpc_handlers(server, gateway: Gateway):
    """Called by grpcserve inside its event loop, with a grpc.aio server and the replica that
    serves on it."""
    control_pb2_grpc.add_NodeControlServicer_to_server(
        NodeControlService.as_servicer(gateway=gateway), server
    )
    checker = health.aio.HealthServicer()
    for name in ["", *SERVICE_NAMES]:
        asyncio.ensure_future(checker.set(name, health_pb2.HealthCheckResponse.SERVING))
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
