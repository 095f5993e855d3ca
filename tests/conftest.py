import json
import os

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from audit.services import Actor
from fleets import services as fleet_services
from tuneplane.models import Membership, Project
from tuneplane.services import api_token_create

# Playwright's sync API runs an event loop in the test thread; the ORM calls the
# tests make beside it are ordinary synchronous ones.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

SYSTEM = Actor.system("tests")


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "")


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def require_redis():
    url = redis_url()
    if not url or not redis_answers(url):
        if os.environ.get("CI"):
            pytest.fail(f"Redis is required in CI and does not answer at {url!r}")
        pytest.skip("no Redis: set REDIS_URL")
    return url


class Api:
    """A client that authenticates the way API users do: a real bearer token."""

    def __init__(self, user=None):
        self.client = APIClient()
        self.user = user
        if user is not None:
            _, secret = api_token_create(actor=SYSTEM, user=user)
            self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    def request(self, method: str, path: str, body=None, **extra):
        data = None if body is None else body if isinstance(body, (str, bytes)) \
            else json.dumps(body)
        return self.client.generic(method, path, data=data or "",
                                   content_type="application/json", **extra)

    def get(self, path, **extra):
        return self.client.get(path, **extra)

    def post(self, path, body=None, **extra):
        return self.request("POST", path, body, **extra)

    def patch(self, path, body=None, **extra):
        return self.request("PATCH", path, body, **extra)

    def delete(self, path, **extra):
        return self.request("DELETE", path, **extra)


@pytest.fixture
def admin_user(db):
    return get_user_model().objects.create_user("ops", password="ops-password-1", is_staff=True)


@pytest.fixture
def project(db):
    return Project.objects.create(slug="ml", name="Machine learning")


@pytest.fixture
def member(db, project):
    user = get_user_model().objects.create_user("mia", password="mia-password-1")
    Membership.objects.create(project=project, user=user)
    return user


@pytest.fixture
def outsider(db):
    return get_user_model().objects.create_user("otto", password="otto-password-1")


@pytest.fixture
def admin_api(admin_user):
    return Api(admin_user)


@pytest.fixture
def member_api(member):
    return Api(member)


@pytest.fixture
def outsider_api(outsider):
    return Api(outsider)


@pytest.fixture
def anon_api(db):
    return Api()


@pytest.fixture
def make_fleet(db):
    def make(id="gpu-lab", kind="node", **fields):
        return fleet_services.fleet_create(actor=SYSTEM, id=id, kind=kind, **fields)

    return make


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": "/usr/bin/chromium"}
