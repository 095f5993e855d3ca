"""The contract every API resource keeps, checked the same way for each.

A subclass names its paths and how to make a visible and an invisible target;
it inherits tests for: anonymous → 401, non-admin write → 403, invisible reads
exactly as missing → 404 (F8), one audit row per write (A1), and its list's
query count flat in the number of rows (STYLE.md, Tests).

A list endpoint with no resource contract of its own keeps the last one through
ListContract; tests/placement/test_api_lists.py holds those, and checks that every
list the OpenAPI document names has one.
"""

from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent

MISSING_ID = "no-such-thing"
SEVERAL = 4  # rows in the longer list; the shorter one has one


def list_paths(schema: dict) -> set[str]:
    """Every path of the OpenAPI document whose GET answers a list, paginated or bare."""
    found = set()
    for path, operations in schema["paths"].items():
        answer = (
            operations.get("get", {})
            .get("responses", {})
            .get("200", {})
            .get("content", {})
            .get("application/json", {})
            .get("schema", {})
        )
        if answer.get("type") == "array" or answer.get("$ref", "").startswith(
            "#/components/schemas/Paginated"
        ):
            found.add(path)
    return found


class ListContract:
    """A list reads in as many queries for several rows as for one: nothing is fetched per
    row — not a related record, not a nested list, not a computed field."""

    list_path: str  # as the OpenAPI document names it: /api/nodes/{node_id}/commands
    list_reader = "admin_api"  # the fixture of the client that reads it

    def list_url(self) -> str:
        """The path to read; a nested list fills in its parent here."""
        return self.list_path

    def make_listed(self, n: int) -> None:
        """Add the n-th row the reader sees in the list, carrying everything a row can show
        (related records, nested lists): a row without them proves nothing."""
        raise NotImplementedError

    def _read(self, api):
        with CaptureQueriesContext(connection) as queries:
            response = api.get(self.list_url())
        assert response.status_code == 200, (self.list_url(), response.content[:300])
        body = response.json()
        return [q["sql"] for q in queries], body["count"] if isinstance(body, dict) else len(body)

    def test_list_query_count_is_flat_in_rows(self, request):
        api = request.getfixturevalue(self.list_reader)
        self.make_listed(0)
        api.get(self.list_url())  # a token's first use records when it was used, once
        one, rows = self._read(api)
        for n in range(1, SEVERAL):
            self.make_listed(n)
        several, more_rows = self._read(api)
        assert more_rows == rows + SEVERAL - 1, "make_listed must add one listed row each"
        per_row = sorted((Counter(several) - Counter(one)).elements())
        assert len(several) == len(one), (
            f"GET {self.list_url()}: {len(one)} queries for {rows} row(s), {len(several)} for "
            f"{more_rows}; what only the longer list ran (a per-row query repeats):\n"
            + "\n".join(per_row)
        )

    @pytest.fixture(autouse=True)
    def _contract_fixtures(self, db, project, member, outsider, make_fleet):
        self.project, self.member, self.outsider, self.make_fleet = (
            project,
            member,
            outsider,
            make_fleet,
        )


class ApiResourceContract(ListContract):
    list_path: str
    create_action: str  # the audit action a successful create records

    # -- what a subclass provides -------------------------------------------------
    def detail_path(self, target_id: str) -> str:
        raise NotImplementedError

    def create_body(self) -> dict:
        raise NotImplementedError

    def patch_body(self) -> dict:
        raise NotImplementedError

    def make_visible(self) -> str:
        """A target the plain member can see; returns its id."""
        raise NotImplementedError

    def make_invisible(self) -> str:
        """A target that exists but the plain member cannot see; returns its id."""
        raise NotImplementedError

    def nested_paths(self, target_id: str) -> list[tuple[str, str]]:
        """(method, path) routes under one target; they must hide it the same way."""
        return []

    # -- the contract -------------------------------------------------------------
    def _routes(self, target_id: str) -> list[tuple[str, str]]:
        detail = self.detail_path(target_id)
        return [
            ("GET", detail),
            ("PATCH", detail),
            ("DELETE", detail),
            *self.nested_paths(target_id),
        ]

    def test_anonymous_is_401_everywhere(self, anon_api, make_fleet):
        target = self.make_visible()
        routes = [("GET", self.list_path), ("POST", self.list_path), *self._routes(target)]
        for method, path in routes:
            response = anon_api.request(
                method, path, self.create_body() if method == "POST" else None
            )
            assert response.status_code == 401, (method, path)
            assert response.json()["error"]["code"] == "not_authenticated", (method, path)
            assert response["WWW-Authenticate"] == "Bearer"

    def test_F5_non_admin_write_is_403(self, member_api):
        target = self.make_visible()
        before = AuditEvent.objects.exclude(action="api_token.created").count()
        attempts = [
            ("POST", self.list_path, self.create_body()),
            ("PATCH", self.detail_path(target), self.patch_body()),
            ("DELETE", self.detail_path(target), None),
        ]
        for method, path, body in attempts:
            response = member_api.request(method, path, body)
            assert response.status_code == 403, (method, path, response.content)
            assert response.json()["error"]["code"] == "permission_denied"
        assert member_api.get(self.detail_path(target)).status_code == 200
        assert AuditEvent.objects.exclude(action="api_token.created").count() == before

    def test_F8_invisible_reads_exactly_as_missing(self, member_api):
        hidden = self.make_invisible()
        for (method, hidden_path), (_, missing_path) in zip(
            self._routes(hidden), self._routes(MISSING_ID), strict=True
        ):
            body = self.patch_body() if method in ("PATCH", "POST") else None
            seen = member_api.request(method, hidden_path, body)
            missing = member_api.request(method, missing_path, body)
            assert seen.status_code == missing.status_code == 404, (method, hidden_path)
            assert seen.content.decode().replace(hidden, "ID") == missing.content.decode().replace(
                MISSING_ID, "ID"
            ), (method, hidden_path)
        listed = member_api.get(self.list_path).json()["results"]
        assert hidden not in {item["id"] for item in listed}

    def test_A1_create_writes_one_audit_event(self, admin_api):
        before = AuditEvent.objects.filter(action=self.create_action).count()
        response = admin_api.post(self.list_path, self.create_body())
        assert response.status_code == 201, response.content
        events = AuditEvent.objects.filter(action=self.create_action)
        assert events.count() == before + 1
        event = events.first()
        assert event.actor_label == admin_api.user.username
        assert event.target_id == str(response.json()["id"])
