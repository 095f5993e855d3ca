"""Logs that follow (issue 39): a member's output read from an offset through the API, from a
real agent over a real gateway. Each answer carries ``next_offset``; polling with it reads
only what came since; a log cut at its limit (R16) past the offset says so and starts at the
oldest byte kept; a job another project's member cannot see is not found, offset or not."""

import pytest

from .agents import wait_until
from .running import state_is, submit

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def logs(api, job_id, **query):
    asked = "&".join(f"{key}={value}" for key, value in query.items())
    response = api.get(f"/api/training-jobs/{job_id}/logs?{asked}")
    assert response.status_code == 200, response.content
    return response.json()


def test_a_log_is_followed_by_polling_with_next_offset_until_the_member_ends(
    running_node, member_api, outsider_api
):
    lines = "for i in 1 2 3 4 5 6; do echo line-$i; sleep 0.5; done"
    job = submit(member_api, cards=1, script=lines)
    wait_until(lambda: state_is(member_api, job["id"], "running"), what="running")
    followed, offset, reads = "", 0, 0
    while True:
        ended = state_is(member_api, job["id"], "succeeded", "failed")
        read = logs(member_api, job["id"], offset=offset)
        assert read["offset"] == offset and not read["truncated"]
        assert read["next_offset"] == offset + len(read["output"].encode())
        followed, offset, reads = followed + read["output"], read["next_offset"], reads + 1
        if ended:
            break
    assert followed == "".join(f"line-{i}\n" for i in range(1, 7)) and reads > 2
    # Without an offset: the tail, and where it starts and ends.
    tail = logs(member_api, job["id"], tail_bytes=7)
    assert (tail["output"], tail["offset"], tail["next_offset"]) == ("line-6\n", 35, 42)
    assert not tail["truncated"]
    # From an offset, bounded by tail_bytes.
    part = logs(member_api, job["id"], offset=7, tail_bytes=14)
    assert (part["output"], part["offset"], part["next_offset"]) == ("line-2\nline-3\n", 7, 21)
    at_end = logs(member_api, job["id"], offset=42)
    assert (at_end["output"], at_end["next_offset"]) == ("", 42)
    refused = member_api.get(f"/api/training-jobs/{job['id']}/logs?offset=-1")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "offset"
    # F8: another project's job is not found, exactly as one that does not exist.
    hidden = outsider_api.get(f"/api/training-jobs/{job['id']}/logs?offset=0")
    missing = outsider_api.get("/api/training-jobs/99999/logs?offset=0")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("running_node", [{"TUNEPLANE_MEMBER_LOG_BYTES": "100000"}], indirect=True)
def test_R16_a_log_cut_past_the_offset_says_so_and_starts_at_the_oldest_byte_kept(
    running_node, member_api
):
    job = submit(
        member_api,
        cards=1,
        script="python3 -c \"import sys; sys.stdout.write('a' * 300000)\"; sleep 2; echo after",
    )
    wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
    read = logs(member_api, job["id"], offset=0)
    assert read["truncated"] and 0 < read["offset"] < 300006 - 40_000
    assert not read["output"].startswith("[tuneplane-node")  # the node's note is not output
    # Followed from there, what is kept reads to the end: the node keeps at most its cap
    # (100,000) and one read of its keeper (64 KiB), R21.
    kept, offset = read["output"], read["next_offset"]
    while more := logs(member_api, job["id"], offset=offset)["output"]:
        kept, offset = kept + more, offset + len(more)
    assert offset == 300006 and read["offset"] == 300006 - len(kept)
    assert len(kept) <= 100_000 + 64 * 1024 and kept.endswith("aaaaafter\n")
    # Within what is kept an offset reads as before the cut.
    inside = logs(member_api, job["id"], offset=300000, tail_bytes=3)
    assert (inside["output"], inside["next_offset"], inside["truncated"]) == ("aft", 300003, False)
