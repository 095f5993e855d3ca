"""The adapter that lets grpc.aio serve django-grpc-framework's Service classes."""

import inspect
from functools import update_wrapper

from django_grpc_framework.services import Service, not_implemented
from django_grpc_framework.signals import grpc_request_finished, grpc_request_started


class AsyncService(Service):
    """django-grpc-framework's Service, with handlers grpc.aio can await.

    The framework's own ``as_servicer`` wraps methods in plain functions and
    fires ``grpc_request_finished`` when a streaming handler returns its
    generator — before the stream has run. Here the two signals surround the
    whole call, and async-generator methods stay async generators.
    """

    @classmethod
    def as_servicer(cls, **initkwargs):
        super().as_servicer(**initkwargs)  # the framework's checks of initkwargs

        def bind(action, request, context):
            service = cls(**initkwargs)
            service.request, service.context, service.action = request, context, action
            return getattr(service, action)

        class Servicer:
            def __getattr__(self, action):
                method = getattr(cls, action, None)
                if method is None:
                    return not_implemented
                if inspect.isasyncgenfunction(method):

                    async def handler(request, context):
                        await grpc_request_started.asend(
                            sender=handler, request=request, context=context
                        )
                        try:
                            async for reply in bind(action, request, context)(request, context):
                                yield reply
                        finally:
                            await grpc_request_finished.asend(sender=handler)
                else:

                    async def handler(request, context):
                        await grpc_request_started.asend(
                            sender=handler, request=request, context=context
                        )
                        try:
                            return await bind(action, request, context)(request, context)
                        finally:
                            await grpc_request_finished.asend(sender=handler)

                update_wrapper(handler, method)
                return handler

        return Servicer()
