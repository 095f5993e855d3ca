"""The agent's member decisions as pure functions (nodes/agent/member/policy.py) and the start
it reads (wire.MemberSpec): no process, cgroup, root or clock — what the runner does with
them on real processes is test_members.py, test_replicas.py and test_containers.py."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.agent.member import policy
from nodes.agent.member.policy import Observed, ended
from nodes.agent.wire import Card, MemberSpec, Refused, Serve

DEVICES = [{"index": i, "uuid": f"GPU-{i}"} for i in range(4)]


def spec(**payload):
    return MemberSpec.parse({"cards": [], "argv": ["true"], **payload})


# The start as read (R4) ----------------------------------------------------------------------


def test_R4_a_start_is_read_into_a_typed_spec_once():
    read = MemberSpec.parse(
        {
            "cards": [{"index": 2, "uuid": "GPU-2"}],
            "script": "echo hi",
            "env": {"LR": 0.001},
            "labels": {"TUNEPLANE_RANK": 0},
            "delivery": {"mode": "shared-mount", "env": {"D": "ml/x"}},
            "rendezvous": {"WORLD_SIZE": 2},
            "serve": {"port": 8000, "readiness_path": "/health"},
            "cpus": 1.5,
            "memory_bytes": 1 << 30,
            "grace_seconds": 0,
        }
    )
    assert read.cards == (Card(2, "GPU-2"),) and read.script == "echo hi" and read.argv == ()
    assert (read.env, read.labels, read.rendezvous) == (
        {"LR": 0.001},
        {"TUNEPLANE_RANK": 0},
        {"WORLD_SIZE": 2},
    )
    assert (read.delivery_mode, read.delivery_env) == ("shared-mount", {"D": "ml/x"})
    assert read.serve == Serve(8000, "/health")
    assert (read.cpus, read.memory_bytes, read.grace) == (1.5, 1 << 30, 0.0)


@pytest.mark.parametrize(
    "payload, why",
    [
        ([], "the start's payload is not an object"),
        ({"cards": []}, "neither argv nor script nor image"),
        ({"cards": [], "argv": [1]}, "neither argv nor script nor image"),
        ({"cards": [], "image": "--privileged"}, "image must be an image reference"),
        ({"cards": "all", "argv": ["x"]}, "cards must be a list of {index, uuid}"),
        ({"cards": [{"uuid": "GPU-0"}], "argv": ["x"]}, "cards must be a list of {index, uuid}"),
    ],
)
def test_R1_a_start_that_cannot_be_read_is_refused_saying_which_part(payload, why):
    with pytest.raises(Refused) as refused:
        MemberSpec.parse(payload)
    assert str(refused.value) == f"refused: {why}"


def test_S1_a_serve_without_a_usable_port_is_no_replica_and_a_bad_path_probes_the_root():
    assert spec(serve={"port": 0}).serve is None
    assert spec(serve={"port": True}).serve is None
    assert spec(serve={"port": 8000, "readiness_path": "no-slash"}).serve == Serve(8000, "/")
    assert spec(serve={"port": 8000, "readiness_path": "/a b"}).serve == Serve(8000, "/")


def test_R1_cards_the_node_lacks_or_another_member_holds_are_refused_never_substituted():
    wanted = spec(cards=[{"index": 1, "uuid": "GPU-1"}, {"index": 3, "uuid": "GPU-3"}])
    assert policy.refusal(wanted, DEVICES, held=set()) == ""
    taken = policy.refusal(wanted, DEVICES, held={3})
    assert taken == "refused: card(s) [3] held by another member"
    wrong = spec(cards=[{"index": 1, "uuid": "GPU-2"}])
    assert policy.refusal(wrong, DEVICES, held=set()) == "refused: no card 1 (GPU-2) on this node"
    image = spec(image="busybox")
    assert policy.refusal(image, DEVICES, set(), runtime="") == (
        "refused: an image, and no container runtime on this node"
    )
    assert policy.refusal(image, DEVICES, set(), runtime="docker") == ""
    # A caller that names no runtime has none (mutmut: the default "" survived).
    assert policy.refusal(image, DEVICES, set()).startswith("refused: an image")


def test_R10_something_that_outlived_its_sigkill_a_minute_is_unkillable_not_before():
    """DESIGN §7: a minute after the SIGKILL, not a moment sooner (mutmut: `>=` → `>` and
    `+` → `-` survived, no test reached it in process)."""
    killed = 1000.0
    assert not policy.unkillable(killed, killed)
    assert not policy.unkillable(killed, killed + policy.UNKILLABLE_AFTER - 0.001)
    assert policy.unkillable(killed, killed + policy.UNKILLABLE_AFTER)
    assert policy.unkillable(killed, killed + 3600)


# How a member ended (R6, R10) ------------------------------------------------------------------


def test_its_exit_file_says_how_it_ended():
    assert ended(Observed(exit_code=0)) == (0, "exit")
    assert ended(Observed(exit_code=3, stopping=True)) == (3, "stopped")
    assert ended(Observed(exit_code=137, oom=True)) == (137, "oom")
    assert policy.final_state(0, "exit") == "succeeded"
    assert policy.final_state(0, "stopped") == policy.final_state(1, "exit") == "failed"


def test_R10_a_member_stopped_while_its_runtime_was_starting_it_ends_as_a_stop_ends_it():
    """The stop's SIGTERM reached the runtime's init before the member ran: its keeper says
    the start failed (125), and that is the stop's end (143, stopped), not a failed start."""
    assert ended(Observed(exit_code=125, stopping=True)) == (143, "stopped")
    assert ended(Observed(exit_code=125)) == (125, "exit")  # no stop: the start failed
    assert ended(Observed(exit_code=124, stopping=True)) == (124, "stopped")
    assert ended(Observed(exit_code=126, stopping=True)) == (126, "stopped")


def test_a_member_runs_while_its_group_leads_or_its_container_runs():
    assert ended(Observed(leader_alive=True)) is None
    running = {"running": True, "exit_code": 0, "oom_killed": False}
    assert ended(Observed(container=running)) is None


def test_R6_a_container_whose_wrapper_is_gone_says_how_it_ended_in_this_boot_only():
    exited = {"running": False, "exit_code": 2, "oom_killed": False}
    assert ended(Observed(container=exited, boot_then="b", boot_now="b")) == (2, "exit")
    killed = {**exited, "exit_code": 137, "oom_killed": True}
    assert ended(Observed(container=killed, boot_then="b", boot_now="b")) == (137, "oom")
    assert ended(Observed(container=exited, boot_then="a", boot_now="b")) == (-1, "node_rebooted")


def test_R6_a_member_with_nothing_left_is_node_rebooted_after_a_reboot_else_vanished():
    assert ended(Observed(boot_then="a", boot_now="b")) == (policy.VANISHED, "node_rebooted")
    assert ended(Observed(boot_then="a", boot_now="a")) == (policy.VANISHED, "vanished")
    assert ended(Observed(stopping=True)) == (-9, "stopped")  # killed with its wrapper


# Stops (R10) -------------------------------------------------------------------------------


def test_R10_a_stop_escalates_to_sigkill_after_its_grace_then_unkillable_a_minute_on():
    assert policy.escalation(None, 5, None, "", now=100) == ""
    assert policy.escalation(100, 5, None, "", now=104.9) == ""
    assert policy.escalation(100, 5, None, "", now=105) == "kill"
    assert policy.escalation(100, 5, 105, "", now=164.9) == ""
    assert policy.escalation(100, 5, 105, "", now=165) == "unkillable"
    assert policy.escalation(100, 5, 105, "unkillable", now=999) == ""  # said once


# Restarts (S1) -------------------------------------------------------------------------------


def restart(**changed):
    values = {"serving": True, "stopping": False, "launched_at": 0.0, "backoff": 0, "code": 1}
    values.update({"reason": "exit", **changed})
    return policy.restart_after_exit(now=10.0, **values)


def test_S1_a_replica_restarts_with_a_doubling_backoff_saying_why():
    first = restart(code=137)
    assert (first.at, first.backoff, first.detail) == (11.0, 1, "exited with 137; restarting in 1s")
    assert restart(backoff=1).detail == "exited with 1; restarting in 2s"
    assert restart(reason="oom").detail.startswith("out of memory")
    assert restart(reason="node_rebooted").detail.startswith("node rebooted")
    assert restart(reason="vanished").detail.startswith("process vanished")
    assert restart(serving=False) is None and restart(stopping=True) is None


def test_S1_a_replica_that_ran_five_minutes_starts_its_backoff_afresh():
    assert restart(backoff=6, launched_at=10.0 - 299).backoff == 7
    assert restart(backoff=6, launched_at=10.0 - 300).backoff == 1


@given(st.integers(min_value=0, max_value=10_000))
def test_S1_the_backoff_never_shrinks_and_never_passes_a_minute(restarts):
    delay = policy.restart_delay(restarts)
    assert policy.RESTART_FIRST <= delay <= policy.RESTART_MAX
    assert policy.restart_delay(restarts + 1) >= delay


# Readiness (S1) ------------------------------------------------------------------------------


def test_S1_one_success_makes_it_ready_three_failures_in_a_row_unready():
    assert policy.probed(False, "", "", failures=0) == (True, "")
    assert policy.probed(False, "", "HTTP 503 from /", failures=1) == (False, "HTTP 503 from /")
    assert policy.probed(True, "", "HTTP 503 from /", failures=2) == (True, "")
    assert policy.probed(True, "", "HTTP 503 from /", failures=3) == (False, "HTTP 503 from /")
    assert len(policy.probed(False, "", "x" * 500, failures=1)[1]) == policy.MAX_DETAIL


words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
specs = st.builds(
    MemberSpec,
    cards=st.lists(st.builds(Card, st.integers(0, 7), words), max_size=4).map(tuple),
    argv=st.lists(words, min_size=1, max_size=3).map(tuple),
    image=st.one_of(st.just(""), words),
    env=st.dictionaries(words, words, max_size=3),
    labels=st.dictionaries(words, st.one_of(words, st.integers()), max_size=3),
    delivery_mode=st.sampled_from(["", "shared-mount", "object-pull"]),
    delivery_env=st.dictionaries(words, words, max_size=2),
    rendezvous=st.dictionaries(words, st.one_of(words, st.integers()), max_size=2),
    serve=st.one_of(st.none(), st.builds(Serve, st.integers(1, 65535), st.just("/health"))),
    cpus=st.one_of(st.none(), st.floats(0.1, 64)),
    memory_bytes=st.one_of(st.none(), st.integers(1, 1 << 40)),
    grace=st.floats(0, 600),
    pull=st.sampled_from(["", "always"]),
)


@given(specs)
def test_R4_what_the_console_writes_the_agent_reads_back_the_same(written):
    """The console builds a start as a MemberSpec (placement/services/starts.py) and the agent
    parses its payload: one shape for both ends."""
    assert MemberSpec.parse(written.payload()) == written


def test_R16_a_container_is_given_at_most_the_cpus_the_machine_has():
    """A node's reported budget may name more CPUs than the machine has (its share is
    computed from it); the runtime refuses such a --cpus, so the agent caps it."""
    import os

    from nodes.agent.member import containers

    argv = containers.run_argv(
        "docker",
        member_id="m",
        scope="s",
        spec=MemberSpec.parse({"image": "busybox", "cards": [], "cpus": 999.0}),
        env_file="/state/m.env",
        scratch="/x",
        storage_root=None,
    )
    assert argv[argv.index("--cpus") + 1] == f"{float(os.cpu_count()):g}"


def test_H4_a_checkpoint_is_marked_when_the_mark_appears_or_changes_never_when_it_goes():
    assert policy.checkpoint_marked(None, [1, 0, 7])
    assert policy.checkpoint_marked([1, 0, 7], [2, 0, 7])  # touched
    assert policy.checkpoint_marked([1, 0, 7], [1, 3, 7])  # written, same second
    assert policy.checkpoint_marked([1, 0, 7], [1, 0, 8])  # replaced
    assert not policy.checkpoint_marked([1, 0, 7], [1, 0, 7])
    assert not policy.checkpoint_marked([1, 0, 7], None)  # removed: no new checkpoint
    assert not policy.checkpoint_marked(None, None)


def test_H4_the_mark_is_a_regular_file_never_followed(tmp_path):
    mark = tmp_path / "mark"
    assert policy.mark_seen(mark) is None
    mark.write_text("x")
    seen = policy.mark_seen(mark)
    assert seen[1] == 1 and seen[2] == mark.stat().st_ino
    link = tmp_path / "link"
    link.symlink_to(mark)
    assert policy.mark_seen(link) is None
    (tmp_path / "dir").mkdir()
    assert policy.mark_seen(tmp_path / "dir") is None
