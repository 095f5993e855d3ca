"""H1–H3 as pure decisions (placement.faults, placement.decide): whose an attempt's end was,
what its job's next attempts stay away from, whether it retries — no database, with
hypothesis properties over sequences of ends."""

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from placement import faults
from placement.decide import NodeCapacity, Request, decide
from placement.faults import MemberEnd

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def ended(state="failed", reason="exit", code=1, node="n1", **more) -> MemberEnd:
    return MemberEnd(node=node, state=state, reason=reason, exit_code=code, started=True, **more)


def test_H1_the_machines_ends_are_infrastructure():
    for member in (
        ended("lost", "lost", None),
        ended("abandoned", "abandoned", None),
        ended("failed", "vanished", -1),
        ended("failed", "node_rebooted", -1),
        ended("failed", "refused", -1),
        ended("failed", "start_failed", -1),
        ended("failed", "exit", 125, runtime=True),  # the OCI runtime could not start it
        ended("failed", "exit", 1, faulted=((0, "GPU-a"),)),  # a fatal XID under it
        ended("unknown", "node_gone", None, node_gone=True),
    ):
        state = "lost" if member.state == "lost" else "failed"
        assert faults.end_class(state, member.reason, [member]) == "infrastructure", member


def test_H1_the_jobs_own_ends_are_user():
    for member in (
        ended("failed", "exit", 1),
        ended("failed", "oom", 137),
        ended("failed", "exit", 125),  # a process member's own 125: not a runtime's
        ended("failed", "exit", 126, runtime=True),
    ):
        assert faults.end_class("failed", member.reason, [member]) == "user", member
    assert faults.end_class("succeeded", "exit", [ended("succeeded", "exit", 0)]) == "user"
    assert faults.end_class("cancelled", "cancelled", [ended("cancelled", "stopped")]) == "user"


def test_H1_a_running_or_preempted_attempt_has_no_class():
    for state in ("starting", "running", "unknown", "preempted"):
        assert faults.end_class(state, "", [ended()]) == ""


def test_H1_a_gang_peers_infrastructure_end_is_the_whole_attempts():
    """Rank 0 exits 1 because its peer's node vanished (NCCL lost it): not the job's fault."""
    members = [ended("failed", "exit", 1, node="n1"), ended("failed", "vanished", -1, node="n2")]
    assert faults.end_class("failed", "exit", members) == "infrastructure"
    laid = faults.excluded("exit", members)
    assert laid.nodes == {"n2": "vanished"} and laid.cards == {}  # the peer's node only


def test_H1_a_gang_deadline_is_the_jobs_only_when_a_member_had_exited():
    late = [ended("running", "", None, node="n1"), MemberEnd(node="n2", state="starting")]
    assert faults.end_class("failed", "gang_deadline", late) == "infrastructure"
    assert faults.excluded("gang_deadline", late).nodes == {"n2": "gang_deadline: never started"}
    exited = [ended("succeeded", "exit", 0, node="n1"), MemberEnd(node="n2", state="starting")]
    assert faults.end_class("failed", "gang_deadline", exited) == "user"


def test_H2_a_card_fault_excludes_the_cards_only_where_the_rest_of_the_node_is_healthy():
    sick = ((3, "GPU-3"),)
    laid = faults.excluded("exit", [ended(faulted=sick, others_healthy=True)])
    assert laid.cards == {("n1", 3, "GPU-3"): "card_fault"} and laid.nodes == {}
    laid = faults.excluded("exit", [ended(faulted=sick, others_healthy=False)])
    assert laid.nodes == {"n1": "card_fault"} and laid.cards == {}
    assert faults.excluded("exit", [ended()]) == faults.Excluded({}, {})  # a user end: nothing


def test_H2_backoff_is_30_s_doubling_to_30_min():
    waits = [faults.infra_backoff(n, 30, 1800).total_seconds() for n in range(1, 10)]
    assert waits == [30, 60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert faults.infra_backoff(10_000, 30, 1800) == timedelta(seconds=1800)


def decide_next(end, reason="exit", code=1, user=1, infra=0, most=3, budget=10, codes=()):
    return faults.next_after(
        end=end,
        reason=reason,
        exit_code=code,
        user_ends=user,
        max_attempts=most,
        infra_ends=infra,
        infra_retries=budget,
        on_exit_codes=codes,
    )


def test_H2_infrastructure_ends_retry_on_their_own_budget_whatever_max_attempts_says():
    after = decide_next("infrastructure", "vanished", -1, user=0, infra=1, most=1)
    assert after.retry and after.reason == "retrying after vanished"
    assert after.backoff == timedelta(seconds=30)
    assert decide_next("infrastructure", "lost", None, infra=10, budget=10).retry  # the 10th
    spent = decide_next("infrastructure", "lost", None, infra=11, budget=10)
    assert not spent.retry and spent.reason == "lost; infra_retries spent"
    assert not decide_next("infrastructure", "lost", None, infra=1, budget=0).retry
    # Whatever its own ends have spent: they are another budget.
    assert decide_next("infrastructure", "lost", None, user=3, infra=1, most=3).retry


def test_H3_only_a_listed_exit_code_retries_counted_against_max_attempts():
    listed = decide_next("user", code=3, user=1, most=2, codes=(3, 4))
    assert listed.retry and listed.reason == "retrying after exit 3" and listed.backoff is None
    assert not decide_next("user", code=3, user=2, most=2, codes=(3,)).retry  # spent
    assert not decide_next("user", code=5, user=1, codes=(3, 4)).retry  # not listed
    assert not decide_next("user", "oom", 137, codes=(137,)).retry  # an OOM is not an exit
    assert not decide_next("user", code=1).retry  # R9: a non-zero exit fails at once
    assert decide_next("user", "gang_deadline", None, user=1).retry  # R9


# A sequence of ends: each the machine's (with the node it was on) or the job's own.
ENDS = st.lists(
    st.tuples(
        st.sampled_from(["vanished", "lost", "card_fault", "start_failed", "exit", "oom"]),
        st.sampled_from([1, 3, 137]),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(ENDS, st.integers(1, 10), st.integers(0, 12), st.sets(st.sampled_from([1, 3, 137])))
def test_H2_H3_property_a_job_is_never_charged_an_attempt_for_an_infrastructure_end(
    ends, most, budget, codes
):
    """Played through next_after as runs does: the job's user ends never exceed
    max_attempts, each infrastructure end leaves them as they were, and the job fails only
    on a user end it may not retry or on its infrastructure budget spent."""
    user = infra = 0
    for reason, code in ends:
        machine = reason in ("vanished", "lost", "card_fault", "start_failed")
        end = "infrastructure" if machine else "user"
        before = user
        user, infra = user + (not machine), infra + machine
        after = faults.next_after(
            end=end,
            reason=reason,
            exit_code=code,
            user_ends=user,
            max_attempts=most,
            infra_ends=infra,
            infra_retries=budget,
            on_exit_codes=codes,
        )
        if machine:
            assert user == before  # never charged
            assert after.retry == (infra <= budget)
        else:
            assert user <= most
            if after.retry:
                assert user < most and reason == "exit" and code in codes
        if not after.retry:
            break


def capacity(node_id: str, cards: int) -> NodeCapacity:
    devices = [{"index": i, "uuid": f"{node_id}-GPU-{i}", "name": "H100"} for i in range(cards)]
    return NodeCapacity(
        node_id, free={"": list(devices)}, devices_by_series={"": cards}, runtime=True
    )


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 3),
    st.sets(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3)), max_size=8),
    st.sets(st.sampled_from(["a", "b", "c"]), max_size=2),
)
def test_H2_property_no_excluded_card_or_node_is_ever_placed_for_that_job(
    cards, nodes, sick_cards, sick_nodes
):
    capacities = {n: capacity(n, 4) for n in ("a", "b", "c")}
    excluded = frozenset((node, f"{node}-GPU-{i}") for node, i in sick_cards)
    job = Request(
        key=("trainingjob", 1, 0),
        order=(NOW, 1),
        cards=cards,
        nodes=nodes,
        excluded_nodes=frozenset(sick_nodes),
        excluded_cards=excluded,
    )
    other = Request(key=("trainingjob", 2, 0), order=(NOW, 2), cards=4)
    placed = decide([job, other], capacities, NOW)
    for placement in placed:
        if placement.request.key != job.key:
            continue
        for node_id, held in placement.members:
            assert node_id not in sick_nodes
            assert not {(node_id, card["uuid"]) for card in held} & excluded
    # What it may use is placed when it fits (exclusion does not stop it elsewhere).
    usable = {
        n: 4 - sum(1 for node, _ in sick_cards if node == n) for n in "abc" if n not in sick_nodes
    }
    if sum(1 for free in usable.values() if free >= cards) >= nodes:
        assert any(p.request.key == job.key for p in placed)


def test_H2_an_excluded_card_is_left_for_another_job():
    capacities = {"a": capacity("a", 2)}
    job = Request(
        key=("trainingjob", 1, 0),
        order=(NOW, 1),
        cards=1,
        excluded_cards=frozenset({("a", "a-GPU-0")}),
    )
    other = Request(key=("trainingjob", 2, 0), order=(NOW, 2), cards=1)
    placed = {p.request.key: p.members for p in decide([job, other], capacities, NOW)}
    assert placed[job.key] == (("a", ({"index": 1, "uuid": "a-GPU-1"},)),)
    assert placed[other.key] == (("a", ({"index": 0, "uuid": "a-GPU-0"},)),)
