import contextlib
import importlib
import json
import os
import uuid

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from audit.services import Actor
from fleets import services as fleet_services
from nodes.services.control import node_report_inventory
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from tuneplane.models import Membership, Project
from tuneplane.services import api_token_create

pytest_plugins = ["tests.missing_parts", "tests.dockerd", "tests.e2e.running"]

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
        data = (
            None if body is None else body if isinstance(body, (str, bytes)) else json.dumps(body)
        )
        return self.client.generic(
            method, path, data=data or "", content_type="application/json", **extra
        )

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
def vision(db):
    """A second project, cv, with a member of its own: a Fleet shared by two (Q1–Q9)."""
    project = Project.objects.create(slug="cv", name="Vision")
    user = get_user_model().objects.create_user("vic", password="vic-password-1")
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
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        from tests.missing_parts import skip_missing

        skip_missing("Chromium", "apt-get install chromium")
    return {**browser_type_launch_args, "executable_path": chromium}


@pytest.fixture(scope="session", autouse=True)
def console_pki(tmp_path_factory):
    """One CA for the session, in a directory of its own."""
    from django.conf import settings

    from nodes import pki

    directory = tmp_path_factory.mktemp("pki")
    settings.TUNEPLANE_PKI_DIR = directory
    pki.ca_init(directory)
    return directory


@pytest.fixture
def secrets_dir(settings, tmp_path):
    """TUNEPLANE_SECRETS_DIR for this test: the only place a *_token_file may name."""
    directory = tmp_path / "secrets"
    directory.mkdir()
    settings.TUNEPLANE_SECRETS_DIR = directory
    return directory


@pytest.fixture(autouse=True)
def _hardware_registry(request):
    """The card registry migrations seed (nodes 0002, and Slurm's gres names in 0012), there
    for every test with a database: a transactional test empties every table when it ends,
    and under pytest-xdist such a test may come before others in the same worker's database."""
    if request.node.get_closest_marker("django_db") is None and not (
        {"db", "transactional_db"} & set(request.fixturenames)
    ):
        return
    request.getfixturevalue("_django_db_helper")
    from django.apps import apps

    from nodes.models import HardwareSeries

    if not HardwareSeries.objects.filter(slug="h100").exists():
        importlib.import_module("nodes.migrations.0002_seed_hardware_series").seed(apps, None)
        importlib.import_module("nodes.migrations.0013_seed_slurm_gres_names").seed(apps, None)


@pytest.fixture(autouse=True)
def _join_rate(settings):
    # Tests join far faster than any operator; the throttle test sets its own rate.
    settings.TUNEPLANE_JOIN_RATE = "100000/minute"
    # Each test counts its windows (throttles, refusals audited once a minute) afresh, in
    # the same cache: a key prefix of its own.
    default = settings.CACHES["default"]
    settings.CACHES = {**settings.CACHES, "default": {**default, "KEY_PREFIX": uuid.uuid4().hex}}


@pytest.fixture
def node_fleet(make_fleet):
    return make_fleet("gpu-lab", kind="node", capabilities=["train", "serve"])


@pytest.fixture
def mint(admin_user):
    from nodes.services.join import join_token_mint

    def mint_for(fleet):
        return join_token_mint(actor=Actor.of_user(admin_user), fleet=fleet)

    return mint_for


@pytest.fixture
def gpu_node(mint):
    """A placeable node (L1) whose cards are known by index and UUID."""

    def make(fleet, cards: int = 8, address: str = "10.0.0.1:1", **reported):
        devices = [
            {**device, "uuid": f"{device['uuid']}-{address}"}
            for device in H100_DEVICE_INVENTORY["devices"][:cards]
        ]
        inventory = {
            **H100_DEVICE_INVENTORY,
            "cards": [{"name": devices[0]["name"], "count": cards}],
            "devices": devices,
            **reported,  # what else its inventory says (container_runtime, say)
        }
        return placeable_node(mint, fleet, inventory, address)

    return make


def placeable_node(mint, fleet, inventory: dict, address: str):
    """A node joined with ``inventory``, its control session open and its inventory fresh:
    placeable (L1) by whatever its inventory says."""
    result = node_join(
        token=mint(fleet)[1],
        fleet_id=fleet.id,
        csr=make_csr()[1],
        inventory=inventory,
        address=address,
    )
    session_open(node_id=result.node.id, serial=result.certificate.serial, gateway="test")
    return node_report_inventory(node_id=result.node.id, inventory=inventory)


def with_devices(inventory: dict) -> dict:
    """The inventory with each card by index and UUID, as an agent reports it: what the
    allocator holds, and so what admission counts (Q9)."""
    names = [card["name"] for card in inventory["cards"] for _ in range(card["count"])]
    devices = [
        {"index": index, "uuid": f"GPU-{index:04d}-fake", "name": name}
        for index, name in enumerate(names)
    ]
    return {**inventory, "devices": devices}


def make_csr(hostname="gpu-01"):
    from nodes.agent.enroll import new_key_and_csr

    return new_key_and_csr(hostname)


H100_INVENTORY = {
    "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 8}],
    "driver": "550.54",
    "container_runtime": "docker 28.2.2",
    "storage_root_visible": True,
    "cpu_budget": 64,
    "memory_budget_bytes": 512 * 2**30,
}
# The same machine with each card by index and UUID, as an agent reports it (R1).
H100_DEVICES = [
    {"index": index, "uuid": f"GPU-0000{index}-h100-fake", "name": "NVIDIA H100 80GB HBM3"}
    for index in range(8)
]
H100_DEVICE_INVENTORY = {**H100_INVENTORY, "devices": H100_DEVICES}
# What a deployment on a node Fleet serves (S1): a process, its port and readiness path.
SERVE = {"command": ["python3", "-m", "http.server"], "port": 8000, "readiness_path": "/"}


# --- The suite's own machinery: test settings, parallel workers, the e2e marker. ---

# Folders whose every test starts real processes (gateways, agents, Celery, a browser, Slurm,
# a live server fuzzed from outside): marked e2e, so `-m "not e2e"` is the quick loop. Tests
# elsewhere that start a process carry the mark themselves.
E2E_FOLDERS = {"e2e", "browser", "slurm", "slurm24", "bench", "attacks", "kube"}
# ... and single tests in modules that do not import pytest (their imports are left alone).
E2E_TESTS = {
    "tests/nodes/test_control.py::test_generated_protobuf_modules_are_up_to_date",
    # Each runs pytest itself, in a subprocess, on a suite of its own.
    "tests/tuneplane/test_missing_parts.py::test_a_missing_part_is_named_on_the_last_line_with_what_installs_it",
    "tests/tuneplane/test_missing_parts.py::test_in_ci_a_missing_part_fails",
}
# Tests that hold a real clock or a storm for many seconds because that is what they prove
# (a TLS handshake waited for past grpc's 20 s; 3,000 calls against a held event loop):
# marked slow, so that `make quick` (not e2e, not slow) stays under a minute. `make test`
# runs them.
SLOW_TESTS = {
    "tests/nodes/test_agent_backoff.py::test_a_handshake_that_takes_long_is_waited_for_past_grpcs_20_s",
    "tests/nodes/test_gateway_backlog.py::test_a_storm_past_cores_default_backlog_loses_no_stream",
    "tests/nodes/test_gateway_backlog.py::test_with_cores_defaults_the_same_storm_loses_streams",
}
# Tests that must run one after another in one pytest-xdist worker, by path: the Slurm tests
# share one cluster (and the machine's munged), the Slurm 24.11 tests another (apart, so the
# two clusters start and run in two workers at once); install.sh's tests and those that start
# runconsole, which builds the agent's wheels when they are missing, build them where
# setuptools builds, in the source tree (nodes/agent/build): two builds at once break each
# other.
XDIST_GROUPS = {
    "tests/slurm/": "slurm",
    "tests/slurm24/": "slurm24",
    "tests/kube/": "kube",  # one etcd and API server for the folder, not one per worker
    "tests/nodes/test_install_sh.py": "agent-wheels",
    "tests/e2e/test_make_run.py": "agent-wheels",
    "tests/e2e/test_make_run_supervised.py": "agent-wheels",
    "tests/e2e/test_postgres_restart.py": "agent-wheels",
    "tests/e2e/test_tour.py": "agent-wheels",  # pip installs the agent from nodes/agent
    # Gangs on real agents: every gang's rank 0 maps the node's first rendezvous port (29500)
    # from the machine to its own namespace (R19), and here every node is this one machine.
    "tests/e2e/test_jobs_outages.py": "gangs",
}
# What gives a test a database (pytest-django's fixtures, and a fresh one for a subprocess).
# A test with none of them and no django_db mark is marked nodb: it is the same on any
# database, and `make test-sqlite` leaves it to the PostgreSQL pass.
DB_FIXTURES = {
    "db",
    "transactional_db",
    "live_server",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "empty_database",
}


def _worker_redis_url(url: str, worker: str) -> str:
    """REDIS_URL for one pytest-xdist worker: the database number less the worker's index
    (gw0 keeps it; with /15, gw1 has /14 ...). The Celery workers a test starts take tasks
    from their broker: two test workers sharing one database would take each other's."""
    from urllib.parse import urlsplit, urlunsplit

    index = int(worker.removeprefix("gw"))
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    if base - index < 0:
        raise pytest.UsageError(
            f"REDIS_URL {url!r} leaves no Redis database for xdist worker "
            f"{worker}: use a higher database number, e.g. /15"
        )
    return urlunsplit(parts._replace(path=f"/{base - index}"))


def pytest_configure(config):
    from django.conf import settings
    from django.contrib.auth.hashers import get_hashers, get_hashers_by_algorithm

    # Tests create users by the hundred: PBKDF2 at production strength made a sample of 245
    # tests take 105 s instead of 10. Only this process: the processes tests start keep the
    # product's hashers.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_hashers.cache_clear()
    get_hashers_by_algorithm.cache_clear()

    # The tests' scrapes of /metrics (a test Client, a gateway's or a console's port) come
    # from loopback: the suite configures loopback as its scraper, as an operator configures
    # Prometheus (R23). This process's settings, and the processes tests start.
    from tuneplane.client_address import parse_trusted_proxies

    os.environ.setdefault("TUNEPLANE_METRICS_ALLOW", "127.0.0.1,::1")
    settings.TUNEPLANE_METRICS_ALLOW = parse_trusted_proxies(os.environ["TUNEPLANE_METRICS_ALLOW"])

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker and redis_url():
        url = _worker_redis_url(redis_url(), worker)
        # Settings were read before this hook (pytest-django loads them first); nothing has
        # connected to Redis yet. The environment is what require_redis and the processes
        # tests start read.
        os.environ["REDIS_URL"] = url
        settings.REDIS_URL = settings.CELERY_BROKER_URL = url
        settings.CACHES = {
            **settings.CACHES,
            "default": {**settings.CACHES["default"], "LOCATION": url},
        }
        from tuneplane.celery import app

        if app.configured:
            app.conf.broker_url = url
    if redis_url():
        # This process's cache keys apart from those of the consoles tests start on the same
        # Redis database: its joins, at the tests' rate (_join_rate), must not count against
        # a console's own (a runconsole at the product's 30 a minute answered 429 after tests
        # had joined from 127.0.0.1 in the same minute).
        settings.CACHES = {
            **settings.CACHES,
            "default": {**settings.CACHES["default"], "KEY_PREFIX": "pytest"},
        }


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tests = os.path.dirname(__file__)
    for item in items:
        folder = os.path.relpath(item.path, tests).split(os.sep)[0]
        if folder in E2E_FOLDERS or item.nodeid in E2E_TESTS:
            item.add_marker(pytest.mark.e2e)
        if folder == "attacks":
            item.add_marker(pytest.mark.attack)
        if item.nodeid in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if not item.get_closest_marker("django_db") and not DB_FIXTURES.intersection(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.nodb)


def pytest_sessionfinish(session):
    """What agents this run started left when a test stopped them with members still running
    (R19, R21): their members' network namespaces, addresses and rules taken down and their
    scratch filesystems unmounted, as an agent's cleanup would have. Only this process's own
    temporary dirs are looked in."""
    from nodes.agent.member import network, sandbox, scratchfs

    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or os.geteuid() != 0:
        return
    base = factory.getbasetemp()
    for container in base.rglob("runtime/*/state.json"):  # what still runs, killed
        state_dir = container.parent.parent.parent
        with contextlib.suppress(Exception):
            sandbox.delete(sandbox.Paths(state_dir), container.parent.name)
    for cache in base.rglob(f"{network.CACHE_DIR}/*.json"):
        state_dir = cache.parent.parent
        for member_id, scope in network.attached_members(state_dir):
            with contextlib.suppress(Exception):
                network.detach(member_id, scope=scope, state_dir=state_dir)
    for image in base.rglob("scratch-images/*.img"):
        state_dir = image.parent.parent
        with contextlib.suppress(Exception):
            scratchfs.remove(state_dir / "members" / image.stem, image)


def pytest_terminal_summary(terminalreporter):
    """Modules past tests/test_layout.py's FLAG_LINES, named for a look (never a failure)."""
    from tests.test_layout import FLAG_LINES, long_modules

    for lines, path in long_modules():
        terminalreporter.write_line(f"layout: {path} has {lines} lines (past {FLAG_LINES})")


def xdist_group(nodeid: str) -> str | None:
    return next((group for path, group in XDIST_GROUPS.items() if nodeid.startswith(path)), None)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup, with the groups of XDIST_GROUPS: each group is one unit of work, every
    other test one of its own; the groups are handed out first. (pytest-xdist 3.8 cannot put
    xdist_group marks into effect under pytest 9, which no longer takes a changed nodeid.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or super()._split_scope(nodeid)

    return Scheduling(config, log)


@pytest.fixture
def world(admin_user, member, project, make_fleet, mint, monkeypatch):
    """What the audit scenarios stand on (tests/audit/scenarios.py's World), made on demand."""
    from tests.audit.scenarios import World

    with contextlib.ExitStack() as stack:
        yield World(
            admin=admin_user,
            member=member,
            make_fleet=make_fleet,
            mint=mint,
            monkeypatch=monkeypatch,
            stack=stack,
        )
