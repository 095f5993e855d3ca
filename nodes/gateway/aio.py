"""The adapter that lets grpc.aio serve django-grpc-framework's Service classes."""

import inspect
from functools import update_wrapper

from django_grpc_framework.services import Service, not_implemented


class AsyncService(Service):
    """django-grpc-framework's Service, with handlers grpc.aio can await.

    The framework's own ``as_servicer`` wraps methods in plain functions, so a streaming
    handler's generator is returned before the stream has run. Here async-generator methods
    stay async generators. Its per-request signals are not sent: their receivers reset the
    queries and close old connections of the calling thread, and on the event loop each
    send hopped to a thread of asgiref's to do so for a connection no handler uses — twice
    per stream, a tenth of the loop in a reconnect storm (issue 20). A handler's database
    work runs on the replica's DatabaseThreads, which look after their connections on every
    call (``db_threads._call``).
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
                        async for reply in bind(action, request, context)(request, context):
                            yield reply
                else:

                    async def handler(request, context):
                        return await bind(action, request, context)(request, context)

                update_wrapper(handler, method)
                return handler

        return Servicer()
