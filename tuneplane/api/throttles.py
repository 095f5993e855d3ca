"""Throttles counted in fixed windows in the shared cache, one atomic step a request
(tuneplane.windows): DRF's own throttle reads the history and writes it back, so a concurrent
burst got through several times over (measured: 10 of 40 at a rate of 5). The counts live
in Redis, shared by every web replica; while Redis is away they live in this process, so
requests go on, still throttled, per replica."""

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from tuneplane.windows import count_in_window


class WindowThrottle(SimpleRateThrottle):
    """A subclass names its ``scope``, its rate and whom a request counts against."""

    def counted_by(self, request):
        raise NotImplementedError

    def allow_request(self, request, view):
        self.num_requests, self.duration = self.parse_rate(self.get_rate())
        count = count_in_window(self.scope, self.counted_by(request), seconds=self.duration)
        return count <= self.num_requests

    def wait(self):
        return self.duration  # at most one window; the count resets when it ends


class LogsThrottle(WindowThrottle):
    """Per user: a log tail is read from the member's node over its control stream, so
    each user may ask for so many a minute (R15, TUNEPLANE_LOGS_RATE)."""

    scope = "logs"

    def get_rate(self):
        return settings.TUNEPLANE_LOGS_RATE

    def counted_by(self, request):
        return getattr(request.user, "pk", None)
