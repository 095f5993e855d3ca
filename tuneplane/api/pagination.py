from rest_framework.pagination import LimitOffsetPagination

from .query import query_int


class Pagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_offset(self, request) -> int:
        """R23: a bounded whole number, else a 400 naming ``offset`` (DRF's own reads any
        size, and a database refuses an OFFSET past its bigint with a 500)."""
        return query_int(request, self.offset_query_param, default=0)
