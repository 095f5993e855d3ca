"""Issue 17, item 9: the admin login locks out a username, and separately an address,
after repeated failures (django-axes), audited — once per lockout, not once per attempt."""

import pytest

from audit.models import AuditEvent

LOGIN = "/admin/login/"


def attempt(client, username, password, address):
    return client.post(
        LOGIN,
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
    )


@pytest.fixture
def limit(settings):
    return settings.AXES_FAILURE_LIMIT


def test_issue17_item9_a_username_is_locked_out_after_repeated_failures(client, admin_user, limit):
    for i in range(limit - 1):
        assert attempt(client, "ops", "wrong", f"198.51.100.{i}").status_code == 200
    assert attempt(client, "ops", "wrong", "198.51.100.98").status_code == 429  # the last
    # The right password, from yet another address: the username is locked.
    assert attempt(client, "ops", "ops-password-1", "198.51.100.99").status_code == 429
    for i in range(50):
        assert attempt(client, "ops", "wrong", f"198.51.100.{i}").status_code == 429
    # 52 refusals while locked out, from 50 addresses: one event, not one per attempt.
    locked = AuditEvent.objects.filter(action="login.locked_out")
    assert [(e.after["username"], e.after["count"]) for e in locked] == [("ops", 1)]


def test_issue17_item9_an_address_is_locked_out_across_usernames(client, admin_user, member, limit):
    for i in range(limit - 1):
        assert attempt(client, f"guess-{i}", "wrong", "203.0.113.5").status_code == 200
    assert attempt(client, "guess-last", "wrong", "203.0.113.5").status_code == 429
    assert attempt(client, "ops", "ops-password-1", "203.0.113.5").status_code == 429
    assert attempt(client, "ops", "ops-password-1", "203.0.113.6").status_code == 302
    assert AuditEvent.objects.filter(
        action="login.locked_out", after__client="203.0.113.5"
    ).exists()
