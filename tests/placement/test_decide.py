"""The allocator's decision without a database (placement.decide; R1, R2, R3, R5, S1, S6).

Examples name the rule they hold; the properties hold for any queue and any Fleet that
hypothesis makes: never two holders for one card nor more than a node has, a gang all or
nothing, admission order kept among requests that fit, and no head-of-line blocking.
"""

import copy
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.decide import NodeCapacity, Request, decide

NOW = datetime(2026, 12, 6, tzinfo=UTC)
GIB = 2**30


def node(node_id: str, cards: int = 8, series: str = "h100", **fields) -> NodeCapacity:
    devices = [{"index": i, "uuid": f"GPU-{node_id}-{i}"} for i in range(cards)]
    return NodeCapacity(
        node_id,
        free={"": list(devices), series: list(devices)} if series else {"": list(devices)},
        devices_by_series={"": cards, **({series: cards} if series else {})},
        **fields,
    )


def request(n: int, cards: int = 1, **fields) -> Request:
    return Request(key=("job", n), order=(n, "job", n), cards=cards, **fields)


def fleet(*nodes: NodeCapacity) -> dict[str, NodeCapacity]:
    return {each.node_id: each for each in nodes}


def placed(placements) -> dict:
    return {p.request.key: p.members for p in placements}


def test_R1_a_pinned_and_an_any_card_request_in_one_pass_get_different_cards():
    decided = decide([request(1, series="h100"), request(2)], fleet(node("a", cards=2)), NOW)
    cards = [card["uuid"] for p in decided for _, held in p.members for card in held]
    assert len(decided) == 2 and len(set(cards)) == 2


def test_R1_never_more_cards_than_the_node_has():
    assert decide([request(1, cards=9)], fleet(node("a")), NOW) == []


def test_R5_cpus_and_memory_stay_within_the_nodes_budget_within_one_pass():
    budget = fleet(node("a", cpus=64, memory=512 * GIB))
    decided = decide(
        [request(1, memory=300 * GIB), request(2, memory=300 * GIB), request(3, cpus=65)],
        budget,
        NOW,
    )
    assert [p.request.key for p in decided] == [("job", 1)]


def test_R2_admission_order_across_kinds_decides_who_gets_the_last_cards():
    replica = Request(key=("replica", 1, 0), order=(1, "replica"), cards=4, quiet="quiet_serve")
    training = Request(key=("trainingjob", 9), order=(2, "trainingjob"), cards=4)
    episode = Request(key=("episode", 3), order=(3, "episode"), cards=4, quiet="quiet_env")
    decided = decide([episode, training, replica], fleet(node("a", cards=8)), NOW)
    assert [p.request.key for p in decided] == [replica.key, training.key]


def test_R2_one_that_cannot_start_does_not_block_a_later_one_that_can():
    decided = decide([request(1, cards=16), request(2, cards=1)], fleet(node("a")), NOW)
    assert [p.request.key for p in decided] == [("job", 2)]


def test_R2_one_waiting_past_the_bound_keeps_later_ones_off_the_node_closest_to_it():
    busy = node("a", cards=8)
    busy.free = {"": busy.free[""][:4], "h100": busy.free["h100"][:4]}  # 4 of 8 held
    decided = decide([request(1, cards=8, reserve=True), request(2, cards=1)], fleet(busy), NOW)
    assert decided == []  # the small one waits: its cards are the big one's when freed


def test_R3_a_gang_gets_all_its_nodes_or_none():
    assert decide([request(1, nodes=3)], fleet(node("a"), node("b")), NOW) == []
    [gang] = decide([request(1, nodes=2)], fleet(node("a"), node("b")), NOW)
    assert {node_id for node_id, _ in gang.members} == {"a", "b"}


def test_R3_a_retry_waits_its_backoff():
    later = request(1, not_before=NOW + timedelta(seconds=60))
    assert decide([later], fleet(node("a")), NOW) == []
    assert len(decide([later], fleet(node("a")), NOW + timedelta(seconds=61))) == 1


def test_S1_one_port_per_node():
    two = [request(n, port=8000, quiet="quiet_serve") for n in (1, 2)]
    decided = decide(two, fleet(node("a"), node("b")), NOW)
    assert sorted(p.members[0][0] for p in decided) == ["a", "b"]
    assert len(decide(two, fleet(node("a")), NOW)) == 1


def test_S6_a_single_node_quiet_for_env_gets_no_new_episode():
    quiet = node("a", quiet=frozenset({"quiet_env"}))
    assert decide([request(1, quiet="quiet_env")], fleet(quiet), NOW) == []
    assert len(decide([request(1)], fleet(node("a", quiet=frozenset({"quiet_env"}))), NOW)) == 1


def test_a_container_goes_only_to_a_node_with_a_runtime():
    assert decide([request(1, container=True)], fleet(node("a")), NOW) == []
    assert len(decide([request(1, container=True)], fleet(node("a", runtime=True)), NOW)) == 1


# --- Properties ---

requests = st.lists(
    st.builds(
        lambda n, cards, gang, series, memory, port: request(
            n,
            cards=cards,
            nodes=gang,
            series=series,
            memory=memory * GIB if memory else None,
            port=port,
        ),
        n=st.integers(0, 10**6),
        cards=st.integers(0, 9),
        gang=st.integers(1, 3),
        series=st.sampled_from(["", "h100", "a100"]),
        memory=st.sampled_from([None, 100, 300]),
        port=st.sampled_from([None, 8000]),
    ),
    max_size=12,
    unique_by=lambda r: r.key,
)
nodes = st.lists(
    st.builds(
        lambda i, cards, series, memory: node(f"n{i}", cards, series, memory=memory * GIB),
        i=st.integers(0, 99),
        cards=st.integers(0, 8),
        series=st.sampled_from(["h100", "a100"]),
        memory=st.sampled_from([256, 512]),
    ),
    max_size=5,
    unique_by=lambda n: n.node_id,
).map(lambda found: fleet(*found))
settled = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settled
@given(requests, nodes)
def test_R1_R5_no_card_twice_and_no_node_past_its_budgets(queue, capacities):
    before = copy.deepcopy(capacities)
    decided = decide(queue, capacities, NOW)
    held = [(node_id, c["uuid"]) for p in decided for node_id, cards in p.members for c in cards]
    assert len(held) == len(set(held))
    for node_id, original in before.items():
        on_it = [(p.request, cards) for p in decided for n, cards in p.members if n == node_id]
        assert all({c["uuid"] for c in cards} <= _uuids(original) for _, cards in on_it)
        assert sum(r.memory or 0 for r, _ in on_it) <= original.memory
        ports = [r.port for r, _ in on_it if r.port is not None]
        assert len(ports) == len(set(ports))
        for r, cards in on_it:
            assert len(cards) == r.cards
            assert all(c["uuid"] in _uuids(original, r.series) for c in cards)


@settled
@given(requests, nodes)
def test_R3_every_gang_gets_all_its_nodes_each_once_or_none(queue, capacities):
    for p in decide(queue, capacities, NOW):
        assert len(p.members) == p.request.nodes
        assert len({node_id for node_id, _ in p.members}) == p.request.nodes


@settled
@given(requests, nodes)
def test_R2_a_request_left_waiting_did_not_fit_what_was_left_when_its_turn_came(queue, capacities):
    """Admission order among those that fit, and no head-of-line blocking: replaying the
    decision in order, each request placed fit when its turn came, and each left waiting
    did not fit what the requests before it had left."""
    replay = copy.deepcopy(capacities)
    chosen = {p.request.key for p in decide(queue, capacities, NOW)}
    for r in sorted(queue, key=lambda r: r.order):
        fitting = [n for n in replay.values() if n.fits(r)]
        if r.key in chosen:
            assert len(fitting) >= r.nodes
            for n in sorted(fitting, key=lambda n: (len(n.free_of(r.series)), n.node_id))[
                : r.nodes
            ]:
                n.take(r)
        else:
            assert len(fitting) < r.nodes, f"{r.key} fit but waited"


def _uuids(capacity: NodeCapacity, series: str = "") -> set[str]:
    return {device["uuid"] for device in capacity.free_of(series)}


def budgeted(node_id: str, cpus=32.0, memory=256 * GIB) -> NodeCapacity:
    """An 8-card node whose inventory reports budgets (what is free of them, and the whole)."""
    return node(node_id, cpus=cpus, memory=memory, budget_cpus=cpus, budget_memory=memory)


def test_R16_a_request_naming_no_cpus_or_memory_gets_its_cards_share_of_the_node():
    [share] = decide([request(1, cards=2)], fleet(budgeted("a")), NOW)
    assert share.given == ((8.0, 64 * GIB),)  # 2 of 8 cards: a quarter of 32 CPUs, 256 GiB


def test_R16_a_member_with_no_cards_gets_one_cpu_and_two_gib_and_asked_values_win():
    decided = decide(
        [request(1, cards=0), request(2, cards=1, cpus=3.0)], fleet(budgeted("a")), NOW
    )
    assert [p.given for p in decided] == [((1.0, 2 * GIB),), ((3.0, 32 * GIB),)]


def test_R16_the_defaults_are_subtracted_so_the_node_never_gives_more_than_its_budget():
    capacity = budgeted("a")
    decided = decide([request(n, cards=2) for n in range(4)], fleet(capacity), NOW)
    assert len(decided) == 4 and capacity.cpus == 0 and capacity.memory == 0
    # Every card is gone too; a card-less member now finds no CPU left for it.
    assert decide([request(9, cards=0)], fleet(capacity), NOW) == []


def test_R16_a_gangs_rendezvous_port_comes_from_its_rank_0_nodes_port_ledger():
    """Never a port a served member holds there, and two gangs whose rank 0 share a node
    never share one; a replica placed after them does not get it either."""
    nodes = fleet(node("a", ports={29500}), node("b"), node("c"))
    first, second = decide([request(1, cards=2, nodes=2), request(2, cards=2, nodes=2)], nodes, NOW)
    assert first.members[0][0] == second.members[0][0] == "a"  # best fit: rank 0 on "a"
    assert (first.rendezvous_port, second.rendezvous_port) == (29501, 29502)
    assert decide([request(3, port=29501)], fleet(nodes["a"]), NOW) == []
    assert decide([request(4, cards=1)], nodes, NOW)[0].rendezvous_port is None  # no gang
