"""Q8's words and numbers on the boundaries a mutant moved (issue 47), without a database:
every wait says its reason with the exact message and numbers a person reads — cards owed
to a guarantee, cards awaiting their health check (H5), cordons cut at three (P8), a gang's
cards and ports counted per node, CPUs and memory said so that what is asked and what a
node has never read the same. Each test was seen failing against the mutant it names."""

from placement.decide import decide
from placement.sharing import Book, QuotaRow
from placement.waits import (
    CORDONS_SAID,
    NodeRow,
    Shortfall,
    Unavailable,
    Wait,
    lacks,
    over_limit,
    owed,
    shortfall,
    unavailable,
    unfit,
)
from tests.placement.test_decide import GIB, NOW, fleet, node, request
from tests.placement.test_waits import why

MIB = 2**20
A, B = 1, 2


def wait_for(req, *nodes, unavailable=None):
    [wait] = why([req], fleet(*nodes), None, unavailable).values()
    return wait


# Cards owed to a guarantee (Q3, Q8)


def test_Q8_cards_owed_to_a_guarantee_say_needs_free_and_owed_of_their_series():
    wait = owed(4, 8, 6, "h100")
    assert wait.reason == "capacity"
    assert wait.message == (
        "needs 6 h100; 4 free, 8 of them owed to work waiting within its guarantee"
    )
    assert wait.numbers == {"needs": 6, "free": 4, "owed": 8}
    assert owed(4, 8, 6, "").message.startswith("needs 6 cards; 4 free, 8 of them owed")


def test_Q8_Q1_over_its_limit_says_held_limit_and_needs_of_its_series():
    wait = over_limit(6, 8, 4, "h100")
    assert wait.reason == "quota"
    assert wait.message == "its project holds 6 of its limit of 8 h100 here; this needs 4"
    assert wait.numbers == {"in_use": 6, "limit": 8, "needs": 4}
    assert over_limit(6, 8, 4, "").message == (
        "its project holds 6 of its limit of 8 cards here; this needs 4"
    )


# Cards awaiting their health check (H5, Q8)


def test_Q8_H5_cards_awaiting_their_check_are_said_with_how_many():
    rows = [NodeRow("n", 4, unhealthy=1, checking=3)]
    found = unavailable(rows, fleet(node("n", cards=4)))
    assert (dict(found), found.checking) == ({"health": 4}, 3)
    wait = wait_for(request(1, cards=8), node("n", cards=4), unavailable=found)
    assert wait.reason == "health"
    assert wait.message == (
        "needs 8 cards; 4 free, 4 more unhealthy or awaiting their health check (3 of them, "
        "rule H5)"
    )
    assert wait.numbers == {"needs": 8, "free": 4, "health": 4, "checking": 3}


def test_Q8_H5_unhealthy_cards_none_awaiting_a_check_say_only_unhealthy():
    for unhealthy in (Unavailable({"health": 4}), {"health": 4}):
        wait = wait_for(request(1, cards=8), node("n", cards=4), unavailable=unhealthy)
        assert wait.message == "needs 8 cards; 4 free, 4 more unhealthy"
        assert wait.numbers == {"needs": 8, "free": 4, "health": 4}


def test_Q8_H5_cards_awaiting_a_check_are_not_said_of_a_wait_on_another_reason():
    found = Unavailable({"node_unreachable": 4, "health": 1}, checking=1)
    wait = wait_for(request(1, cards=8), node("n", cards=4), unavailable=found)
    assert wait.reason == "node_unreachable"
    assert wait.message == "needs 8 cards; 4 free, 4 more on nodes not connected now"
    assert "checking" not in wait.numbers


# Cordons quoted up to three (P8, Q8)


def test_Q8_P8_exactly_three_cordons_are_all_quoted_and_a_fourth_is_counted():
    assert CORDONS_SAID == 3
    quoted = "operator: reason 0; operator: reason 1; operator: reason 2"
    for count, said in ((3, quoted), (4, f"{quoted}; and 1 more")):
        rows = [NodeRow(f"c{n}", 1, cordons=(f"operator: reason {n}",)) for n in range(count)]
        wait = wait_for(request(1, cards=count), unavailable=unavailable(rows, {}))
        assert (
            wait.message == f"needs {count} cards; 0 free, {count} more on cordoned nodes ({said})"
        )


# A gang's cards and its port, counted per node (R3, S1, Q8)


def test_Q8_a_gang_whose_cards_are_free_but_not_on_enough_nodes_says_per_node():
    gang = request(1, cards=4, nodes=2)
    wait = wait_for(gang, node("n", cards=8), node("m", cards=2))
    assert wait.reason == "capacity"
    assert wait.numbers["short"] == ["cards"]
    assert wait.numbers["cards"] == {"asks": 4, "nodes_with": 1}
    assert wait.message == (
        "needs 8 cards; 10 free, but no node has enough cards: it asks 4 cards free on each "
        "of 2 nodes (1 have them)"
    )


def test_Q8_a_port_in_use_on_one_of_two_nodes_says_one_of_two():
    gang = request(1, cards=1, nodes=2, port=8000)
    wait = wait_for(gang, node("n", ports={8000}), node("m"))
    assert wait.numbers["short"] == ["port"]
    assert wait.numbers["port"] == {"asks": 8000, "nodes_with": 1}
    assert wait.message.endswith("it asks port 8000 free (in use on 1 of 2 nodes)")


# CPUs and memory said so that what is asked and what a node has never read the same


def test_Q8_cpus_that_round_alike_are_said_in_full():
    wait = wait_for(request(1, cards=0, cpus=2), node("n", cpus=1.9999999))
    assert wait.numbers["cpus"] == {"asks": 2, "most_free": 1.9999999, "node": "n"}
    assert wait.message.endswith("it asks 2.0 CPUs (the most free on a node is 1.9999999, on n)")


def test_Q8_one_cpu_is_said_as_one_cpu():
    wait = wait_for(request(1, cards=0, cpus=1), node("n", cpus=0.5))
    assert wait.message.endswith("it asks 1 CPU (the most free on a node is 0.5, on n)")


def test_Q8_exactly_a_gib_is_said_in_gib_and_below_it_in_mib():
    wait = wait_for(request(1, cards=0, memory=GIB), node("n", memory=512 * MIB))
    assert wait.message.endswith(
        "it asks 1 GiB of memory (the most free on a node is 512 MiB, on n)"
    )


def test_Q8_memory_that_rounds_alike_is_said_in_bytes_in_mib_and_at_a_gib():
    wait = wait_for(request(1, cards=0, memory=512 * MIB), node("n", memory=512 * MIB - 1))
    assert wait.message.endswith(
        f"it asks {512 * MIB} bytes of memory (the most free on a node is {512 * MIB - 1} "
        "bytes, on n)"
    )
    wait = wait_for(request(1, cards=0, memory=GIB + 1), node("n", memory=GIB))
    assert wait.message.endswith(
        f"it asks {GIB + 1} bytes of memory (the most free on a node is {GIB} bytes, on n)"
    )


def test_Q8_a_quiet_node_of_two_says_one_of_two_are_quiet():
    episode = request(1, cards=0, nodes=2, quiet="quiet_env")
    wait = wait_for(episode, node("n", quiet={"quiet_env"}), node("m"))
    assert wait.numbers["short"] == ["quiet"]
    assert wait.numbers["quiet"] == {"asks": "quiet_env", "nodes_with": 1}
    assert wait.message.endswith("it asks a node not quiet for episodes (1 of 2 are quiet)")


def test_Q8_a_missing_runtime_says_it_asks_one_and_how_many_nodes_have_one():
    wait = wait_for(request(1, container=True), node("n"), node("m"))
    assert wait.numbers["runtime"] == {"asks": True, "nodes_with": 0}
    assert wait.message.endswith("a container runtime for its image (0 of 2 nodes have one)")


def test_Q8_the_cpus_named_are_the_closest_nodes_where_each_node_asks_its_share():
    """R16: a request naming no CPUs asks its cards' share of each node's budget, so what
    it asks differs by node: the node named is the one closest to taking it (the most left
    once it has what it asks there), not the one with the most CPUs."""
    req = request(1, cards=2)
    big = node("a", cards=8, cpus=6, budget_cpus=32)  # asks 8 here, has 6: 2 short
    small = node("b", cards=4, cpus=3, budget_cpus=8)  # asks 4 here, has 3: 1 short
    wait = wait_for(req, big, small)
    assert wait.numbers["cpus"] == {"asks": 4, "most_free": 3, "node": "b"}
    assert wait.message == (
        "needs 2 cards; 12 free, but no node has enough CPUs: it asks 4 CPUs (the most free "
        "on a node is 3, on b)"
    )


def test_Q8_a_node_without_a_cpu_budget_is_not_weighed_for_cpus():
    """CPUs on one node, a quiet flag on the other: each is named apart, and the node that
    reports no CPU budget (it lacks none) is not the one whose CPUs are quoted."""
    episode = request(1, cards=0, cpus=4, quiet="quiet_env")
    wait = wait_for(episode, node("a", cpus=2), node("b", quiet={"quiet_env"}))
    assert (wait.numbers["short"], wait.numbers["apart"]) == (["cpus", "quiet"], True)
    assert wait.numbers["cpus"] == {"asks": 4, "most_free": 2, "node": "a"}


def test_Q8_a_node_lacks_nothing_at_the_cpu_tolerance_or_with_another_port_in_use():
    """lacks() holds decide's own tests (NodeCapacity.fits): CPUs within 1e-9 of the ask are
    enough, and a served port (S1) is short only where that port is in use."""
    assert lacks(request(1, cpus=2), node("n", cpus=2 - 1e-9)) == ()
    assert lacks(request(1, port=8000), node("n", ports={9000})) == ()
    assert lacks(request(1, port=8000), node("n", ports={8000})) == ("port",)
    assert lacks(request(1, cards=9), node("n")) == ("cards",)


def test_Q8_R2_nodes_enough_for_it_lack_nothing_even_beside_nodes_that_do():
    """Exactly as many nodes with everything as the request asks: nothing is short (what kept
    it off them is a reservation, R2), whatever the other nodes lack."""
    found = shortfall(request(1, cpus=4), fleet(node("a", cpus=8), node("b", cpus=2)))
    assert found == Shortfall({}, nodes=2) and not found
    gang = request(1, cpus=4, nodes=2)
    found = shortfall(gang, fleet(node("a", cpus=8), node("b", cpus=8), node("c", cpus=2)))
    assert found == Shortfall({}, nodes=3)
    found = shortfall(gang, fleet(node("a", cpus=8), node("c", cpus=2)))
    assert found == Shortfall({"cpus": {"asks": 4, "most_free": 8, "node": "a"}}, nodes=2)


# Where the cards went this pass (Q3, Q8)


def test_Q8_cards_taken_ahead_in_its_own_project_say_needs_free_and_ahead():
    own = [request(1, cards=8, project=A), request(2, cards=8, project=A, priority=5)]
    waits: dict = {}
    decide(own, fleet(node("n")), NOW, Book(rows={(A, ""): QuotaRow()}), waits)
    [wait] = waits.values()
    assert wait.reason == "priority"
    assert (
        wait.message
        == "needs 8 cards; the 1 placed ahead of it in its project took them (0 free now)"
    )
    assert wait.numbers == {"needs": 8, "free": 0, "ahead": 1}


def test_Q8_a_wait_read_outside_a_pass_is_first_come_first_served_and_needs_no_cache():
    """unfit() alone, as a caller without quotas reads it: another project's work placed
    first took the cards first come, first served, not "within a guarantee" (Q3 holds only
    with quotas); no cache of shortfalls is needed."""
    capacities = fleet(node("n"))
    placed = decide([request(1, cards=8, project=B)], capacities, NOW)
    wait = unfit(request(2, cards=8, project=A), capacities, 8, placed, {})
    assert wait == Wait(
        "capacity",
        "needs 8 cards; 1 admitted before it took them (0 free now)",
        {"needs": 8, "free": 0, "placed_first": 1},
    )
    alone = unfit(request(3, cards=12, series="h100"), fleet(node("m")), 8, [], {})
    assert alone == Wait("capacity", "needs 12 h100; 8 free", {"needs": 12, "free": 8})


def test_Q8_Q3_cards_gone_to_other_projects_say_within_guarantees_or_by_fair_share():
    others = [request(1, cards=8, project=A), request(2, cards=8, project=B)]
    guaranteed = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)})
    waits: dict = {}
    decide(others, fleet(node("n")), NOW, guaranteed, waits)
    assert waits[("job", 1)] == Wait(
        "capacity",
        "needs 8 cards; they went to 1 within other projects' guarantees (0 free now)",
        {"needs": 8, "free": 0, "guaranteed_first": 1},
        1,
        1,
    )
    fair = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow()}, usage={A: 1e9})
    waits = {}
    decide(others, fleet(node("n")), NOW, fair, waits)
    assert waits[("job", 1)] == Wait(
        "fair_share",
        "needs 8 cards; they went to 1 of other projects first by fair share (0 free now)",
        {"needs": 8, "free": 0, "placed_first": 1},
        1,
        1,
    )
