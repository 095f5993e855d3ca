"""README's story of serving, against `make run` on its embedded defaults (SQLite, the
filesystem broker) with the real agent on the same machine: a small HTTP server deployed and
Ready at its address, a new revision rolled out, the deployment stopped; an episode run
(DESIGN §7, S1–S5)."""

import json
import urllib.request

from tests.agent_members import free_port

from .test_make_run import call
from .test_make_run_jobs import make_run_with_an_agent, wait_for


def served(address: str) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://{address}/", timeout=3) as response:
            return response.read()
    except OSError:
        return None


def test_a_deployment_serves_rolls_out_and_stops_and_an_episode_runs_against_make_run(
    tmp_path, empty_database
):
    capabilities = ("train", "serve", "env")
    with make_run_with_an_agent(tmp_path, empty_database, capabilities) as (base, token):
        first, second = free_port(), free_port()
        status, body = call(
            "POST",
            f"{base}/api/deployments",
            token,
            {
                "project": "ml",
                "name": "chat",
                "fleet": "gpu-lab",
                "cards": 1,
                "port": first,
                "command": ["python3", "-m", "http.server", str(first), "--bind", "0.0.0.0"],
                "readiness_path": "/",
            },
        )
        assert status == 201, body
        path = f"{base}/api/deployments/{json.loads(body)['id']}"

        def deployment():
            status, body = call("GET", path, token)
            assert status == 200, body
            return json.loads(body)

        ready = wait_for(lambda: (d := deployment())["status"] == "ready" and d, what="Ready")
        [address] = ready["addresses"]
        assert address.endswith(f":{first}") and served(f"127.0.0.1:{first}") is not None

        status, body = call(
            "POST",
            f"{path}/revisions",
            token,
            {
                "port": second,
                "command": ["python3", "-m", "http.server", str(second), "--bind", "0.0.0.0"],
            },
        )
        assert status == 201, body
        wait_for(
            lambda: [r["state"] for r in deployment()["revisions"]] == ["retired", "live"]
            and deployment()["status"] == "ready",
            what="revision 2 rolled out",
        )
        assert deployment()["addresses"][0].endswith(f":{second}")
        wait_for(lambda: served(f"127.0.0.1:{first}") is None, what="revision 1 stopped")

        assert call("PATCH", path, token, {"state": "stopped"})[0] == 200
        wait_for(
            lambda: all(
                m["cleanup"] == "cleaned" for r in deployment()["revisions"] for m in r["members"]
            ),
            what="every replica cleaned up",
        )
        assert served(f"127.0.0.1:{second}") is None

        status, body = call(
            "POST",
            f"{base}/api/environments",
            token,
            {"project": "ml", "name": "env", "manifest": {"fleet": "gpu-lab"}},
        )
        assert status == 201, body
        episodes = f"{base}/api/environments/{json.loads(body)['id']}/episodes"
        status, body = call("POST", episodes, token, {"command": ["python3", "-c", "print(0.75)"]})
        assert status == 201, body

        def episode():
            return json.loads(call("GET", f"{episodes}/1", token)[1])

        done = wait_for(lambda: (e := episode())["state"] == "succeeded" and e, what="done")
        assert done["exit_code"] == 0
        status, body = call("GET", f"{episodes}/1/logs", token)
        assert status == 200 and json.loads(body)["output"] == "0.75\n", body
