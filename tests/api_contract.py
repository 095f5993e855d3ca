"""The contract every API resource keeps, checked the same way for each.

A subclass names its paths and how to make a visible and an invisible target;
it inherits tests for: anonymous → 401, non-admin write → 403, invisible reads
exactly as missing → 404 (F8), and one audit row per write (A1).
"""

import pytest

from audit.models import AuditEvent

MISSING_ID = "no-such-thing"


class ApiResourceContract:
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
        return [("GET", detail), ("PATCH", detail), ("DELETE", detail),
                *self.nested_paths(target_id)]

    def test_anonymous_is_401_everywhere(self, anon_api, make_fleet):
        target = self.make_visible()
        routes = [("GET", self.list_path), ("POST", self.list_path), *self._routes(target)]
        for method, path in routes:
            response = anon_api.request(method, path, self.create_body()
                                        if method == "POST" else None)
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
        for (method, hidden_path), (_, missing_path) in zip(self._routes(hidden),
                                                            self._routes(MISSING_ID)):
            body = self.patch_body() if method in ("PATCH", "POST") else None
            seen = member_api.request(method, hidden_path, body)
            missing = member_api.request(method, missing_path, body)
            assert seen.status_code == missing.status_code == 404, (method, hidden_path)
            assert (seen.content.decode().replace(hidden, "ID")
                    == missing.content.decode().replace(MISSING_ID, "ID")), (method, hidden_path)
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

    @pytest.fixture(autouse=True)
    def _contract_fixtures(self, db, project, member, outsider, make_fleet):
        self.project, self.member, self.outsider, self.make_fleet = (
            project, member, outsider, make_fleet)
