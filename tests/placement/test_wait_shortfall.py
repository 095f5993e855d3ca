"""Q8, without a database: when the Fleet's free cards are not what is short, a ``capacity``
wait names what the nodes lack — CPUs (asked against the most free on a node), memory, a
free port (S1), a container runtime (an image), a node not quiet (L2, L3, S6), a node not
excluded (H2) — each with its numbers (issue 49: a 0-card episode waited with "needs 0
cards … 0 free, none on such a node"). Cards short keep their words."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.services import Actor
from placement.services import submission
from placement.services.allocator import allocate
from placement.waits import lacks, shortfall
from tests.placement.test_decide import GIB, fleet, node, request
from tests.placement.test_quotas import submit
from tests.placement.test_waits import why


def wait_for(req, *nodes):
    [wait] = why([req], fleet(*nodes)).values()
    return wait


def test_Q8_a_0_card_episode_says_it_needs_no_cards_and_which_resource_is_short():
    episode = request(1, cards=0, cpus=4, quiet="quiet_env")
    wait = wait_for(episode, node("n", cpus=2.0, memory=64 * GIB))
    assert wait.reason == "capacity"
    assert wait.numbers["short"] == ["cpus"] and not wait.numbers["apart"]
    assert wait.numbers["cpus"] == {"asks": 4, "most_free": 2.0, "node": "n"}
    assert wait.message == (
        "needs no cards, but no node has enough CPUs: it asks 4 CPUs (the most free on a "
        "node is 2, on n)"
    )
    assert "0 free" not in wait.message and "such a node" not in wait.message


def test_Q8_cpus_short_by_a_thousandth_are_short_and_said_apart():
    wait = wait_for(request(1, cards=0, cpus=2), node("n", cpus=1.999))
    assert wait.numbers["short"] == ["cpus"]
    assert "2 CPUs (the most free on a node is 1.999, on n)" in wait.message
    assert why([request(1, cards=0, cpus=2)], fleet(node("n", cpus=2.0))) == {}  # enough
    # What a pass leaves of a budget can be a hair under it in floating point: still enough.
    assert lacks(request(1, cards=0, cpus=0.3), node("n", cpus=0.1 + 0.2 - 1e-12)) == ()


def test_Q8_memory_exactly_enough_is_not_short_and_a_byte_less_is():
    exactly = node("n", cpus=1.0, memory=8 * GIB)
    assert why([request(1, cards=0, memory=8 * GIB)], fleet(exactly)) == {}
    assert lacks(request(1, cards=0, memory=8 * GIB), node("n", memory=8 * GIB)) == ()
    wait = wait_for(request(1, cards=0, memory=8 * GIB), node("n", memory=8 * GIB - 1))
    assert wait.numbers["short"] == ["memory"]
    assert wait.numbers["memory"] == {"asks": 8 * GIB, "most_free": 8 * GIB - 1, "node": "n"}
    # Rounded, the two would read the same: the bytes are said.
    assert f"{8 * GIB} bytes of memory (the most free on a node is {8 * GIB - 1} bytes" in (
        wait.message
    )
    # Exactly enough memory beside too few CPUs: only the CPUs are named.
    wait = wait_for(request(1, cards=0, cpus=2, memory=8 * GIB), node("n", cpus=1, memory=8 * GIB))
    assert wait.numbers["short"] == ["cpus"] and "memory" not in wait.message


def test_Q8_several_things_short_at_once_are_each_named():
    episode = request(1, cards=0, cpus=4, memory=16 * GIB, container=True, port=8000)
    n = node("n", cpus=2.0, memory=8 * GIB, ports={8000})
    wait = wait_for(episode, n)
    assert wait.numbers["short"] == ["cpus", "memory", "port", "runtime"]
    assert wait.message.startswith(
        "needs no cards, but no node has enough CPUs, memory, a free port and a container "
        "runtime: it asks 4 CPUs (the most free on a node is 2, on n); 16 GiB of memory (the "
        "most free on a node is 8 GiB, on n); port 8000 free (in use on 1 of 1 nodes); a "
        "container runtime for its image (0 of 1 nodes have one)"
    )
    assert wait.numbers["port"] == {"asks": 8000, "nodes_with": 0}


def test_Q8_what_is_on_some_node_but_never_with_the_rest_is_named_as_such():
    cpus_here, memory_there = node("a", cpus=8, memory=GIB), node("b", cpus=1, memory=32 * GIB)
    wait = wait_for(request(1, cards=1, cpus=4, memory=16 * GIB), cpus_here, memory_there)
    assert (wait.numbers["short"], wait.numbers["apart"]) == (["cpus", "memory"], True)
    assert "no node has all it asks at once (CPUs and memory: each on some node" in wait.message
    assert wait.message.startswith("needs 1 cards; 16 free, but")


def test_Q8_a_node_that_lacks_more_is_not_what_is_named_when_another_lacks_less():
    # a lacks CPUs only, b lacks CPUs and memory: CPUs alone keep it off; memory does not.
    found = shortfall(
        request(1, cards=0, cpus=4, memory=4 * GIB),
        fleet(node("a", cpus=2, memory=8 * GIB), node("b", cpus=1, memory=GIB)),
    )
    assert list(found.short) == ["cpus"] and not found.apart
    assert found.short["cpus"] == {"asks": 4, "most_free": 2, "node": "a"}


def test_Q8_quiet_and_excluded_nodes_are_named():
    wait = wait_for(request(1, cards=0, quiet="quiet_env"), node("n", quiet={"quiet_env"}))
    assert wait.numbers["short"] == ["quiet"] and "not quiet for episodes" in wait.message
    wait = wait_for(request(1, excluded_nodes=frozenset({"n"})), node("n"))
    assert wait.numbers["short"] == ["excluded"] and "rule H2" in wait.message


def test_Q8_cards_short_keep_their_words_whatever_else_is_short():
    wait = wait_for(request(1, cards=12, series="h100", cpus=128), node("n", cpus=1))
    assert (wait.message, wait.numbers) == ("needs 12 h100; 8 free", {"needs": 12, "free": 8})


def test_Q8_a_0_card_request_with_no_node_at_all_says_so():
    [wait] = why([request(1, cards=0)], fleet()).values()
    assert wait.reason == "capacity"
    assert wait.message == "needs no cards, but no node of its Fleet takes work now"
    found = why([request(1, cards=0)], fleet(), None, {"cordoned": 8})
    [wait] = found.values()
    assert wait.reason == "cordoned" and wait.message.startswith(
        "needs no cards, but no node takes work now; 8 cards on cordoned nodes"
    )


@pytest.fixture
def env_lab(make_fleet, gpu_node):
    """One node of 8 cards, 64 CPUs and 512 GiB that trains and runs environments."""
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "env"])
    return fleet, gpu_node(fleet)


def test_Q8_through_the_api_a_0_card_episode_behind_a_full_node_names_cpus_and_memory(
    env_lab, member, member_api
):
    """An 8-card job holds the node's cards and, by their share, all its CPUs and memory
    (R16); an episode asking no cards gets 1 CPU and 2 GiB, which no node has free."""
    fleet, gpu = env_lab
    submit(member, "ml", "all-of-it", cards=8)
    environment = submission.environment_submit(
        actor=Actor.of_user(member), project="ml", name="env", manifest={"fleet": "gpu-lab"}
    )
    path = f"/api/environments/{environment.pk}/episodes"
    response = member_api.post(path, {"command": ["python3", "run.py"], "cards": 0})
    assert response.status_code == 201, response.content
    allocate(fleet_id=fleet.id)
    waiting = member_api.get(f"{path}/1").json()["waiting"]
    assert waiting["reason"] == "capacity"
    assert waiting["numbers"]["short"] == ["cpus", "memory"]
    assert waiting["numbers"]["cpus"] == {"asks": 1.0, "most_free": 0.0, "node": gpu.pk}
    assert waiting["message"] == (
        "needs no cards, but no node has enough CPUs and memory: it asks 1 CPU (the most "
        f"free on a node is 0, on {gpu.pk}); 2 GiB of memory (the most free on a node is "
        f"0 MiB, on {gpu.pk})"
    )


@settings(max_examples=300)
@given(
    cards=st.integers(0, 3),
    cpus=st.sampled_from([None, 0.5, 1.0, 2.0, 2.001]),
    memory=st.sampled_from([None, GIB, 2 * GIB, 8 * GIB]),
    port=st.sampled_from([None, 8000]),
    container=st.booleans(),
    node_cards=st.integers(0, 3),
    node_cpus=st.sampled_from([None, 0.0, 1.0, 2.0]),
    node_memory=st.sampled_from([None, 0, 2 * GIB, 8 * GIB - 1]),
    ports=st.sampled_from([set(), {8000}]),
    runtime=st.booleans(),
    quiet=st.booleans(),
    excluded=st.booleans(),
)
def test_Q8_a_node_lacks_nothing_exactly_when_the_allocator_fits_it(
    cards,
    cpus,
    memory,
    port,
    container,
    node_cards,
    node_cpus,
    node_memory,
    ports,
    runtime,
    quiet,
    excluded,
):
    """``lacks`` asks what placement.decide's ``fits`` asks, one by one: they never differ."""
    req = request(
        1,
        cards=cards,
        cpus=cpus,
        memory=memory,
        port=port,
        container=container,
        excluded_nodes=frozenset({"n"} if excluded else ()),
    )
    n = node(
        "n",
        cards=node_cards,
        cpus=node_cpus,
        memory=node_memory,
        budget_cpus=8.0,
        budget_memory=16 * GIB,
        ports=set(ports),
        runtime=runtime,
        quiet=frozenset({"quiet_train"} if quiet else ()),
    )
    assert (lacks(req, n) == ()) == n.fits(req)
