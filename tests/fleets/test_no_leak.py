"""F8: a project Fleet the caller cannot see reads exactly as a Fleet that does not exist.

Every /api/ route that takes a Fleet id, every workload that names a Fleet, every automatic
refusal (P6) and every list answers with the same status, headers and body, once the id
itself is set aside. The invisible Fleet is a rich one: placeable nodes, an outstanding join
token, workloads of its own project.
"""

import json
import re

import pytest
from django.urls import URLResolver, get_resolver

from audit.models import AuditEvent
from audit.services import Actor
from fleets.choices import FleetState
from fleets.models import Fleet
from nodes.models import JoinToken
from nodes.services.control import node_report_inventory
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from placement.services import submission
from tests.conftest import H100_DEVICE_INVENTORY, H100_INVENTORY, SERVE, make_csr, with_devices
from tuneplane.models import Project

HIDDEN, MISSING = "hidden-lab", "absent-lab"  # the same length and shape


SIXTEEN_H100 = with_devices(
    {**H100_INVENTORY, "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 16}]}
)
EIGHT_A100 = with_devices(
    {**H100_INVENTORY, "cards": [{"name": "NVIDIA A100-SXM4-80GB", "count": 8}]}
)

# How to call each route that takes a Fleet id: every method it supports, with the bodies
# to send. A route or method missing here fails the sweep until someone says how to call it.
CALLS = {
    "api/fleets/<str:fleet_id>": {
        "GET": [None],
        "HEAD": [None],
        "OPTIONS": [None],
        "DELETE": [None],
        "PATCH": [
            {"capabilities": ["eval"]},
            {"state": "disabled"},
            {"kind": "slurm"},
            {"id": "renamed"},
            {"visibility": "public"},
            {"unknown": 1},
            "not json",
        ],
    },
    "api/fleets/<str:fleet_id>/join-tokens": {
        "GET": [None],
        "HEAD": [None],
        "OPTIONS": [None],
        "POST": [None, {}, {"unknown": 1}],
    },
    "api/fleets/<str:fleet_id>/health-breaker": {
        "GET": [None],
        "HEAD": [None],
        "OPTIONS": [None],
    },
    "api/fleets/<str:fleet_id>/health-breaker/reset": {"OPTIONS": [None], "POST": [None, {}]},
    "api/fleets/<str:fleet_id>/drain": {
        "OPTIONS": [None],
        "POST": [None, {}, {"reason": "x"}, {"reason": "x", "deadline": "yesterday"}],
    },
    "api/fleets/<str:fleet_id>/quotas": {
        "GET": [None],
        "HEAD": [None],
        "OPTIONS": [None],
        "PUT": [None, {}, {"quotas": [{"project": "ml", "guaranteed": 1}]}, "not json"],
    },
}


# -- the worlds --------------------------------------------------------------------------


@pytest.fixture
def add_node(mint):
    """A node that may take work now: joined, a live lease, inventory observed just now."""

    def add(fleet, inventory=H100_DEVICE_INVENTORY):
        joined = node_join(
            token=mint(fleet)[1],
            fleet_id=fleet.id,
            csr=make_csr()[1],
            inventory=inventory,
            address=f"10.0.{Fleet.objects.count()}.1:1",
        )
        session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="test")
        node_report_inventory(node_id=joined.node.id, inventory=inventory)

    return add


@pytest.fixture
def visible(make_fleet, add_node, project):
    """What the member sees: a public Fleet of one 8 × H100 node that trains and serves, and
    its own project's draining eval Fleet."""
    add_node(make_fleet("gpu-lab", capabilities=["train", "serve"]))
    make_fleet(
        "ml-lab",
        capabilities=["eval"],
        visibility="project",
        project=project,
        state=FleetState.DRAINING,
    )


@pytest.fixture
def make_hidden(make_fleet, add_node, mint, admin_user):
    """The invisible Fleet of project "secret": everything, more of it than any visible one,
    and work of its own. Returns its project's deployment and environment."""

    def make():
        secret = Project.objects.create(slug="secret", name="Secret")
        made = make_fleet(
            HIDDEN,
            capabilities=["train", "eval", "serve", "env"],
            visibility="project",
            project=secret,
            config={"storage_root": "/mnt/secret"},
        )
        for inventory in (SIXTEEN_H100, SIXTEEN_H100, EIGHT_A100):
            add_node(made, inventory)
        mint(made)
        submission.training_job_submit(
            actor=Actor.of_user(admin_user),
            project="secret",
            name="t",
            series="h100",
            cards=16,
            command=["true"],
        )
        return (
            submission.deployment_submit(
                actor=Actor.of_user(admin_user),
                project="secret",
                name="d",
                fleet=HIDDEN,
                cards=1,
                **SERVE,
            ),
            submission.environment_submit(
                actor=Actor.of_user(admin_user),
                project="secret",
                name="e",
                manifest={"fleet": HIDDEN},
            ),
        )

    return make


@pytest.fixture
def hidden(visible, make_hidden):
    return make_hidden()


@pytest.fixture
def callers(member_api, outsider_api, anon_api):
    return {"member": member_api, "outsider": outsider_api, "anonymous": anon_api}


# -- comparing ---------------------------------------------------------------------------


def shown(response, target_id=None, volatile=()) -> tuple:
    """Status, headers and body, the target's id set aside; ``volatile`` top-level keys of a
    created record (its id, its time) dropped."""

    def aside(text):  # the id as a whole word only: a short number is in many a header
        return (
            text
            if target_id is None
            else re.sub(rf"(?<![\w-]){re.escape(str(target_id))}(?![\w-])", "<id>", text)
        )

    headers = {name: aside(value) for name, value in response.items() if name != "X-Request-ID"}
    body = response.content.decode()
    if volatile and response.status_code == 201:
        body = json.dumps({k: v for k, v in response.json().items() if k not in volatile})
        headers.pop("Content-Length", None)  # an id one digit longer is not a leak
    return response.status_code, headers, aside(body)


def difference(what: str, seen: tuple, missing: tuple) -> list[str]:
    if seen == missing:
        return []
    parts = [
        f"{name} {a!r} vs {b!r}"
        for name, a, b in zip(("status", "headers", "body"), seen, missing, strict=True)
        if a != b
    ]
    return [f"{what}: " + "; ".join(parts)]


def report(differences: list[str], rule: str) -> str:
    return f"{rule}: {len(differences)} answers differ\n  " + "\n  ".join(differences)


def named(body: dict, fleet_id: str) -> str:
    return json.dumps(body).replace("FLEET", fleet_id)


# -- the routes ----------------------------------------------------------------------------


def api_routes(patterns=None, prefix=""):
    """Every URL pattern under /api/: its route and its view class (None for a function)."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from api_routes(entry.url_patterns, route)
        elif route.startswith("api/"):
            callback = entry.callback
            yield (
                route,
                entry.pattern.regex.groupindex,
                (getattr(callback, "view_class", None) or getattr(callback, "cls", None)),
            )


def methods_of(view) -> list[str]:
    if view is None:  # a function view says nothing of its methods: assume any
        return ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]
    methods = [m.upper() for m in view.http_method_names if m != "head" and hasattr(view, m)]
    return methods + ["HEAD"] * ("GET" in methods)


def takes_fleet(route: str, kwarg: str) -> bool:
    return "fleet" in kwarg or bool(re.search(rf"fleets/(<(\w+:)?{kwarg}>|\(\?P<{kwarg}>)", route))


def fleet_routes() -> tuple[dict, int]:
    found, total = {}, 0
    for route, kwargs, view in api_routes():
        total += 1
        if any(takes_fleet(route, kwarg) for kwarg in kwargs):
            found[route] = sorted(methods_of(view))
    return found, total


def test_F8_every_route_taking_a_fleet_id_answers_as_for_a_missing_fleet(hidden, callers):
    found, total = fleet_routes()
    assert total >= 20, f"the walk found only {total} /api/ routes"
    known = {route: sorted(methods) for route, methods in CALLS.items()}
    unknown = {route: methods for route, methods in found.items() if known.get(route) != methods}
    assert not unknown, f"F8: say in CALLS how to call these Fleet-scoped routes: {unknown}"
    assert set(found) == set(known), f"routes in CALLS no longer found: {set(known) - set(found)}"
    before = (
        list(Fleet.objects.filter(pk__in=[HIDDEN, MISSING]).values()),
        JoinToken.objects.filter(fleet_id=HIDDEN).count(),
        AuditEvent.objects.count(),
    )
    differences = []
    for route, methods in CALLS.items():
        for method, bodies in methods.items():
            for body in bodies:
                for who, api in callers.items():
                    answers = [
                        shown(
                            api.request(method, "/" + re.sub(r"<[^>]+>", target, route), body),
                            target,
                        )
                        for target in (HIDDEN, MISSING)
                    ]
                    differences += difference(f"{method} /{route} as {who} with {body!r}", *answers)
    assert not differences, report(differences, "F8")
    assert before == (
        list(Fleet.objects.filter(pk__in=[HIDDEN, MISSING]).values()),
        JoinToken.objects.filter(fleet_id=HIDDEN).count(),
        AuditEvent.objects.count(),
    ), "a request through an invisible id changed it"


# -- workloads that name a Fleet -----------------------------------------------------------

NAMING = [
    ("training-jobs", {"fleet": "FLEET"}),  # a field no job reads: 400, whatever the Fleet
    ("lifecycle-jobs", {"kind": "eval", "fleet": "FLEET"}),
    ("deployments", {"fleet": "FLEET"}),
    ("deployments", {"fleet": "FLEET", "series": "h100", "cards": 12}),
    ("deployments", {"fleet": "FLEET", "series": "a100-80gb", "cards": 1}),
    ("deployments", {"fleet": "FLEET", "cards": 0}),
    ("deployments", {"fleet": "FLEET", "cards": 1, "unknown": True}),
    ("deployments", {"fleet": "FLEET", "project": "secret"}),
    ("playground-sessions", {"fleet": "FLEET"}),
    ("environments", {"manifest": {"fleet": "FLEET"}}),
    ("environments", {"manifest": {"fleet": "FLEET", "image": "gym:1"}}),
    ("environments", {"manifest": {"fleet": "FLEET"}, "name": ""}),
    ("volumes", {"name": "v", "fleet": "FLEET"}),
    ("datasets", {"name": "d", "fleet": "FLEET"}),
]


def test_F8_a_workload_naming_an_invisible_fleet_is_answered_as_for_a_missing_one(hidden, callers):
    differences = []
    for path, body in NAMING:
        for who, api in callers.items():
            answers = [
                shown(
                    api.post(f"/api/{path}", named({"project": "ml", "name": "w", **body}, target)),
                    target,
                )
                for target in (HIDDEN, MISSING)
            ]
            differences += difference(f"POST /api/{path} as {who} with {body}", *answers)
    assert not differences, report(differences, "F8")


def test_F8_a_join_naming_an_invisible_fleet_is_refused_as_for_a_missing_one(
    hidden, anon_api, mint
):
    fleet = Fleet.objects.get(pk="gpu-lab")
    differences = []
    for token in ("tpj_not-a-token", mint(fleet)[1]):
        body = {"token": token, "fleet": "FLEET", "csr": make_csr()[1], "inventory": H100_INVENTORY}
        answers = [
            shown(anon_api.post("/api/nodes/join", named(body, target)), target)
            for target in (HIDDEN, MISSING)
        ]
        differences += difference(f"POST /api/nodes/join with token {token[:8]}…", *answers)
    assert not differences, report(differences, "F8")


def absent_pk(record) -> int:
    """A primary key with as many digits as the record's, that no row has."""
    digits = len(str(record.pk))
    return next(
        pk for pk in range(10**digits - 1, 0, -1) if not type(record).objects.filter(pk=pk).exists()
    )


def test_F8_another_projects_deployment_and_environment_read_as_missing_ones(
    hidden, callers, member_api
):
    deployment, environment = hidden
    own = member_api.post(
        "/api/deployments", {"project": "ml", "name": "mine", "cards": 1, **SERVE}
    )
    assert own.status_code == 201, own.content
    differences = []
    requests = [
        ("GET", "/api/deployments/ID", None, deployment),
        ("PATCH", "/api/deployments/ID", {"state": "stopped"}, deployment),
        ("POST", "/api/environments/ID/resolve", None, environment),
    ]
    for method, path, body, target in requests:
        for who, api in callers.items():
            answers = [
                shown(api.request(method, path.replace("ID", str(pk)), body), pk)
                for pk in (target.pk, absent_pk(target))
            ]
            differences += difference(f"{method} {path} as {who}", *answers)
    for body in ({"fleet": "FLEET"}, {"fleet": "FLEET", "state": "bogus"}):
        answers = [
            shown(
                member_api.patch(f"/api/deployments/{own.json()['id']}", named(body, target)),
                target,
            )
            for target in (HIDDEN, MISSING)
        ]
        differences += difference(f"PATCH own deployment with {body}", *answers)
    assert not differences, report(differences, "F8")


# -- answers that must not change when the invisible Fleet appears -------------------------


def with_and_without_hidden(make_hidden, api, requests, volatile=()) -> list[str]:
    """Each request's answer before the invisible Fleet exists, then after."""

    def answers():
        return [
            shown(api.request(method, path, body), volatile=volatile)
            for method, path, body in requests
        ]

    without = answers()
    make_hidden()
    return [
        line
        for (method, path, body), a, b in zip(requests, without, answers(), strict=True)
        for line in difference(f"{method} {path} with {body}", a, b)
    ]


AUTOMATIC = [
    ("training-jobs", {"series": "h100", "cards": 12}),
    ("training-jobs", {"cards": 12}),
    ("training-jobs", {"series": "h100", "cards": 8, "nodes": 2}),
    ("training-jobs", {"series": "a100-80gb", "cards": 1}),
    ("training-jobs", {"series": "h100", "cards": 1}),
    ("training-jobs", {"cards": 0}),
    ("training-jobs", {"cards": 1, "volumes": ["nope"]}),
    ("lifecycle-jobs", {"kind": "eval", "cards": 1}),
    ("lifecycle-jobs", {"kind": "export", "series": "h100", "cards": 12}),
    ("deployments", {"series": "h100", "cards": 12}),
    ("deployments", {"cards": 1}),
    ("playground-sessions", {"cards": 12}),
    ("playground-sessions", {"series": "a100-80gb", "cards": 1}),
]


def test_P6_F8_automatic_placement_answers_the_same_with_or_without_the_invisible_fleet(
    visible, make_hidden, member_api
):
    """Refusal reason, message and best offer, and the Fleet chosen, never count it."""
    requests = [
        ("POST", f"/api/{path}", {"project": "ml", "name": "w", **body}) for path, body in AUTOMATIC
    ]
    differences = with_and_without_hidden(
        make_hidden, member_api, requests, volatile=("id", "created_at")
    )
    assert not differences, report(differences, "P6/F8")
    refused = member_api.post(
        "/api/training-jobs", {"project": "ml", "name": "w", "series": "h100", "cards": 12}
    )
    assert refused.json()["error"]["best_offer"] == ("largest fit: 8 × h100 on one node in gpu-lab")


LISTS = [
    "/api/fleets",
    "/api/fleets?project=secret",
    "/api/fleets?visibility=project",
    "/api/fleets?kind=node&state=active",
    "/api/fleets?limit=1",
    "/api/fleets?limit=1&offset=2",
    f"/api/nodes?fleet={HIDDEN}",
    f"/api/audit?target_id={HIDDEN}",
    "/api/training-jobs",
    "/api/deployments",
    "/api/environments",
]


@pytest.mark.parametrize("who", ["member", "outsider"])
def test_F8_lists_neither_show_nor_count_the_invisible_fleet(visible, make_hidden, callers, who):
    api = callers[who]
    differences = with_and_without_hidden(make_hidden, api, [("GET", p, None) for p in LISTS])
    assert not differences, report(differences, "F8")
    listed = api.get("/api/fleets").json()
    expected = ["gpu-lab", "ml-lab"] if who == "member" else ["gpu-lab"]
    assert [f["id"] for f in listed["results"]] == expected
    assert listed["count"] == len(expected)
    assert api.get("/api/fleets?project=secret").json() == {
        "count": 0,
        "next": None,
        "previous": None,
        "results": [],
    }
