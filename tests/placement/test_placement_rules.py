"""P3, P5, P7 pinned down: the exact URI an object-pull job is handed, which node an
environment resolves to, and admission that checks inventory without reserving it."""

import pytest

from nodes.services.control import node_report_inventory, session_open
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr


@pytest.fixture
def joined(mint):
    """A node of a Fleet that may take work now: a live lease, inventory observed just now.
    Returns it with the serial of its credential, to open sessions again."""
    def join(fleet, address="10.0.0.1:1"):
        result = node_join(token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1],
                           inventory=H100_INVENTORY, address=address)
        session_open(node_id=result.node.id, serial=result.certificate.serial, gateway="gw-1")
        node = node_report_inventory(node_id=result.node.id, inventory=H100_INVENTORY)
        return node, result.certificate.serial
    return join


def submit(api, path, **body):
    response = api.post(f"/api/{path}", {"project": "ml", "name": "w", **body})
    assert response.status_code == 201, response.content
    return response.json()


# -- P3: volumes and datasets reach a job through its Fleet's delivery --------------------

@pytest.mark.parametrize("public_url", ["https://tuneplane.corp", "https://tuneplane.corp/"])
@pytest.mark.parametrize("path, extra", [("training-jobs", {}),
                                         ("lifecycle-jobs", {"kind": "export"})])
def test_P3_object_pull_storage_without_its_own_uri_is_pulled_from_the_console(
        settings, make_fleet, joined, member_api, project, public_url, path, extra):
    settings.TUNEPLANE_PUBLIC_URL = public_url
    joined(make_fleet("pull", kind="node", delivery="object-pull", capabilities=["train"]))
    for kind, name, uri in [("volumes", "ckpt", ""), ("datasets", "tokens", ""),
                            ("datasets", "corpus", "s3://corp/corpus")]:
        made = member_api.post(f"/api/{kind}", {"project": "ml", "name": name, "uri": uri})
        assert made.status_code == 201, made.content

    job = submit(member_api, path, cards=1, volumes=["ckpt"], datasets=["tokens", "corpus"],
                 **extra)

    expected = [
        {"kind": "volume", "name": "ckpt", "delivery": "object-pull",
         "uri": "https://tuneplane.corp/objects/ml/volumes/ckpt"},
        {"kind": "dataset", "name": "corpus", "delivery": "object-pull",
         "uri": "s3://corp/corpus"},
        {"kind": "dataset", "name": "tokens", "delivery": "object-pull",
         "uri": "https://tuneplane.corp/objects/ml/datasets/tokens"},
    ]
    assert job["fleet"] == "pull"
    assert job["delivery"] == expected
    listed = member_api.get(f"/api/{path}").json()["results"]
    assert [entry["delivery"] for entry in listed] == [expected]
