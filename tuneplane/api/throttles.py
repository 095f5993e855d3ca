"""Per-user throttles on what costs a node: a log tail is read from the member's node over
its control stream, so each user may ask for so many a minute (R15,
TUNEPLANE_LOGS_RATE), counted in the shared cache with one atomic step (tuneplane.windows)."""

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from tuneplane.windows import count_in_window


class LogsThrottle(SimpleRateThrottle):
    scope = "logs"

    def get_rate(self):
        return settings.TUNEPLANE_LOGS_RATE

    def allow_request(self, request, view):
        self.num_requests, self.duration = self.parse_rate(self.get_rate())
        user = getattr(request.user, "pk", None)
        count = count_in_window(self.scope, user, seconds=self.duration)
        return count <= self.num_requests

    def wait(self):
        return self.duration  # at most one window; the count resets when it ends
