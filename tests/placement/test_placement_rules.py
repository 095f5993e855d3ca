"""P3, P5, P7 pinned down: the exact URI an object-pull job is handed, which node an
environment resolves to, and admission that checks inventory without reserving it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.models import ControlSession, Node
from nodes.services.control import node_report_inventory
from nodes.services.join import node_join
from nodes.services.sessions import session_close, session_open
from placement.models import TrainingJob
from tests.conftest import H100_DEVICE_INVENTORY, make_csr


@pytest.fixture
def joined(mint):
    """A node of a Fleet that may take work now: a live lease, inventory observed just now.
    Returns it with the serial of its credential, to open sessions again."""

    def join(fleet, address="10.0.0.1:1"):
        result = node_join(
            token=mint(fleet)[1],
            fleet_id=fleet.id,
            csr=make_csr()[1],
            inventory=H100_DEVICE_INVENTORY,
            address=address,
        )
        session_open(node_id=result.node.id, serial=result.certificate.serial, gateway="gw-1")
        node = node_report_inventory(node_id=result.node.id, inventory=H100_DEVICE_INVENTORY)
        return node, result.certificate.serial

    return join


def runs(path: str) -> dict:
    """A job on a node Fleet says what it runs (DESIGN §7)."""
    return {"command": ["true"]} if path.endswith("-jobs") else {}


def submit(api, path, **body):
    response = api.post(f"/api/{path}", {"project": "ml", "name": "w", **runs(path), **body})
    assert response.status_code == 201, response.content
    return response.json()


# -- P3: volumes and datasets reach a job through its Fleet's delivery --------------------


@pytest.mark.parametrize("public_url", ["https://tuneplane.corp", "https://tuneplane.corp/"])
@pytest.mark.parametrize(
    "path, extra", [("training-jobs", {}), ("lifecycle-jobs", {"kind": "export"})]
)
def test_P3_object_pull_storage_without_its_own_uri_is_pulled_from_the_console(
    settings, make_fleet, joined, member_api, project, public_url, path, extra
):
    settings.TUNEPLANE_PUBLIC_URL = public_url
    joined(make_fleet("pull", kind="node", delivery="object-pull", capabilities=["train"]))
    for kind, name, uri in [
        ("volumes", "ckpt", ""),
        ("datasets", "tokens", ""),
        ("datasets", "corpus", "s3://corp/corpus"),
    ]:
        made = member_api.post(f"/api/{kind}", {"project": "ml", "name": name, "uri": uri})
        assert made.status_code == 201, made.content

    job = submit(
        member_api, path, cards=1, volumes=["ckpt"], datasets=["tokens", "corpus"], **extra
    )

    expected = [
        {
            "kind": "volume",
            "name": "ckpt",
            "delivery": "object-pull",
            "uri": "https://tuneplane.corp/objects/ml/volumes/ckpt",
        },
        {"kind": "dataset", "name": "corpus", "delivery": "object-pull", "uri": "s3://corp/corpus"},
        {
            "kind": "dataset",
            "name": "tokens",
            "delivery": "object-pull",
            "uri": "https://tuneplane.corp/objects/ml/datasets/tokens",
        },
    ]
    assert job["fleet"] == "pull"
    assert job["delivery"] == expected
    listed = member_api.get(f"/api/{path}").json()["results"]
    assert [entry["delivery"] for entry in listed] == [expected]


# -- P5: an environment's node is resolved from nodes answering now -----------------------


@pytest.fixture
def environment(make_fleet, member_api, project):
    """An environment on a Fleet that declares env, and its nodes made by the test."""
    fleet = make_fleet("envs", kind="node", capabilities=["env"])
    made = member_api.post(
        "/api/environments", {"project": "ml", "name": "e", "manifest": {"fleet": "envs"}}
    )
    assert made.status_code == 201, made.content
    return fleet, made.json()["id"]


def resolved(api, environment_id) -> str | None:
    """The node resolved, or None when the resolution is refused for want of one."""
    response = api.post(f"/api/environments/{environment_id}/resolve")
    if response.status_code == 422:
        assert response.json()["error"]["reason"] == "no_node_answering", response.content
        return None
    assert response.status_code == 200, response.content
    return response.json()["node"]


def heard(node: Node, seconds_ago: float) -> None:
    """Its latest session heard from it then: the most recently heard is picked first."""
    ControlSession.objects.filter(node=node).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=seconds_ago)
    )


def open_session(node: Node) -> ControlSession:
    return ControlSession.objects.get(node=node, closed_at__isnull=True)


def test_P5_a_node_whose_session_closed_is_never_picked_a_live_one_is(
    environment, joined, member_api
):
    fleet, environment_id = environment
    closed, _ = joined(fleet, "10.0.0.1:1")
    live, _ = joined(fleet, "10.0.0.2:1")
    session_close(session_id=open_session(closed).id, reason="stream ended")
    heard(closed, 0)  # heard from last, and its lease not run out: only the close counts
    heard(live, 5)
    assert ControlSession.objects.get(node=closed).lease_expires_at > timezone.now()

    assert [resolved(member_api, environment_id) for _ in range(3)] == [live.id] * 3
    session_close(session_id=open_session(live).id, reason="stream ended")
    assert resolved(member_api, environment_id) is None


def test_P5_a_node_whose_lease_expired_is_never_picked_a_live_one_is(
    environment, joined, member_api
):
    fleet, environment_id = environment
    expired, _ = joined(fleet, "10.0.0.1:1")
    live, _ = joined(fleet, "10.0.0.2:1")
    heard(expired, 0)
    heard(live, 5)
    ControlSession.objects.filter(node=expired).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )  # open, but not renewed

    assert [resolved(member_api, environment_id) for _ in range(3)] == [live.id] * 3
    ControlSession.objects.filter(node=live).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert resolved(member_api, environment_id) is None


def test_P5_one_session_must_be_both_open_and_within_its_lease(environment, joined, member_api):
    """A closed session whose lease had time left, and a newer open one past its lease:
    neither answers now, whatever the two say together."""
    fleet, environment_id = environment
    node, serial = joined(fleet, "10.0.0.1:1")
    session_close(session_id=open_session(node).id, reason="stream ended")
    reopened = session_open(node_id=node.id, serial=serial, gateway="gw-2")
    ControlSession.objects.filter(pk=reopened.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    heard(node, 0)
    assert ControlSession.objects.filter(
        node=node, closed_at__isnull=False, lease_expires_at__gt=timezone.now()
    ).exists()

    assert resolved(member_api, environment_id) is None
    live, _ = joined(fleet, "10.0.0.2:1")
    heard(live, 5)
    assert resolved(member_api, environment_id) == live.id


# -- P7: inventory fit is a check, not a reservation ----------------------------------------


def test_P7_two_jobs_admitted_onto_the_same_cards_are_both_admitted(
    make_fleet, joined, member_api, project
):
    node, _ = joined(make_fleet("gpu-lab", kind="node", capabilities=["train"]))
    assert node.series_cards == {"h100": 8}

    first = submit(member_api, "training-jobs", series="h100", cards=8)
    second = submit(member_api, "training-jobs", series="h100", cards=8)

    for job in (first, second):
        assert job["fleet"] == "gpu-lab"
        assert job["admission"]["fits_on_nodes"] == 1
    jobs = TrainingJob.objects.filter(fleet_id="gpu-lab")
    assert [job.admission["fits_on"] for job in jobs] == [[node.id], [node.id]]
    node.refresh_from_db()
    assert (node.series_cards, node.card_count) == ({"h100": 8}, 8)
