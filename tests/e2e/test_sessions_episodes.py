"""Playground sessions (S4) and episodes (S5, S6) run for real on a node Fleet: submitted
through the API, placed by a real worker, run by the real agent over a real gateway, ended by
a real beat — a session at its lifetime, an episode by its exit or its own timeout, never by
its node's silence."""

import signal

import pytest

from placement.models import CardHold
from tests.agent_members import SERVER, free_port

from .agents import wait_until
from .running import answers

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def test_S4_a_session_serves_at_its_address_until_its_lifetime_then_is_stopped_and_cleaned(
    serving_node,
    member_api,
):
    node, _, _ = serving_node
    port = free_port()
    response = member_api.post(
        "/api/playground-sessions",
        {
            "project": "ml",
            "name": "try",
            "cards": 1,
            "command": ["python3", "-c", SERVER],
            "port": port,
            "readiness_path": "/health",
            "ttl_seconds": 15,
        },
    )
    assert response.status_code == 201, response.content
    path = f"/api/playground-sessions/{response.json()['id']}"
    shown = wait_until(lambda: (b := member_api.get(path).json())["address"] and b, 60, "Ready")
    assert shown["address"] == f"127.0.0.1:{port}" and answers(port)["env"]["PORT"] == str(port)

    def cleaned():
        body = member_api.get(path).json()
        return body if body["members"][0]["cleanup"] == "cleaned" else None

    ended = wait_until(cleaned, 60, "ended at its lifetime and cleaned up")
    assert ended["state"] == "stopped" and "lifetime" in ended["reason"]
    assert ended["address"] is None and answers(port) is None
    assert not CardHold.objects.filter(node=node).exists()


def environment(api) -> str:
    response = api.post(
        "/api/environments", {"project": "ml", "name": "env", "manifest": {"fleet": "serve-lab"}}
    )
    assert response.status_code == 201, response.content
    return f"/api/environments/{response.json()['id']}/episodes"


def episode(api, path, **body) -> str:
    response = api.post(path, body)
    assert response.status_code == 201, response.content
    return f"{path}/{response.json()['number']}"


def ended(api, path, timeout=60):
    return wait_until(
        lambda: (b := api.get(path).json())["state"] not in ("queued", "starting", "running") and b,
        timeout,
        f"{path} ended",
    )


def test_S5_an_episode_that_finishes_reports_its_exit_duration_and_output(
    serving_node,
    member_api,
):
    path = episode(
        member_api,
        environment(member_api),
        command=["sh", "-c", "echo reward=0.75; sleep 1; exit 4"],
        cards=1,
    )
    body = ended(member_api, path)
    assert (body["state"], body["exit_code"]) == ("failed", 4)
    assert body["duration_seconds"] >= 1
    logs = member_api.get(f"{path}/logs?tail_bytes=100")
    assert logs.status_code == 200 and "reward=0.75" in logs.json()["output"]


def test_S5_an_episode_past_its_timeout_is_stopped_and_timed_out(
    serving_node,
    member_api,
):
    path = episode(member_api, environment(member_api), command=["sleep", "600"], timeout_seconds=3)
    body = ended(member_api, path)
    assert body["state"] == "timed_out" and "after 3s" in body["reason"]


def test_S6_an_episode_in_flight_while_its_node_is_quiet_for_env_is_not_failed_by_it(
    serving_node,
    member_api,
    admin_api,
):
    node, start_agent, agents = serving_node
    path = episode(
        member_api, environment(member_api), command=["sleep", "12"], timeout_seconds=120
    )
    wait_until(lambda: member_api.get(path).json()["state"] == "running", 60, "running")
    agents[-1].send_signal(signal.SIGKILL)
    agents[-1].wait(10)
    wait_until(
        lambda: admin_api.get(f"/api/nodes/{node.id}").json()["liveness"]["env"] == "quiet",
        30,
        "the node quiet for env",
    )
    assert member_api.get(path).json()["state"] == "running"  # the silence fails nothing
    start_agent()
    body = ended(member_api, path)
    assert (body["state"], body["exit_code"]) == ("succeeded", 0)
