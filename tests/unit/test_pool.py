"""The upstream pool's pure parts: rendezvous placement, the load bound, the remembered
replicas of plain-HTTP chains, the health and ejection state machine, and the order a request
tries the replicas in (docs/pool.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from wsmode.config import UpstreamSettings
from wsmode.core.actions import Route
from wsmode.core.routing import CLIENT, CONNECTION, CONTENT, chain_key
from wsmode.upstream.client import UpstreamClient
from wsmode.upstream.pool import HOMES, Health, Load, UpstreamPool, bounded, rendezvous

NAMES = [f"10.0.0.{i}:8000" for i in range(1, 6)]
URLS = [f"http://{n}/v1" for n in NAMES[:3]]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pool(clock: Clock | None = None, **kw: object) -> UpstreamPool:
    settings = replace(UpstreamSettings(urls=tuple(URLS)), **kw)  # type: ignore[arg-type]
    return UpstreamPool(UpstreamClient(URLS[0], settings), settings, URLS, clock or Clock())


# ------------------------------------------------------------------ rendezvous


def test_rendezvous_is_a_stable_ranking_of_every_replica() -> None:
    first = rendezvous(NAMES, "chain-a")
    assert sorted(first) == sorted(NAMES)
    assert rendezvous(reversed(NAMES), "chain-a") == first  # the input order does not matter
    assert rendezvous(NAMES, "chain-a") == first


def test_rendezvous_spreads_keys_over_replicas() -> None:
    tops = Counter(rendezvous(NAMES, f"chain-{i}")[0] for i in range(2000))
    assert set(tops) == set(NAMES)
    assert min(tops.values()) > 2000 / len(NAMES) * 0.7  # roughly even


def test_losing_a_replica_moves_only_its_own_chains() -> None:
    keys = [f"chain-{i}" for i in range(500)]
    before = {k: rendezvous(NAMES, k)[0] for k in keys}
    gone = NAMES[2]
    after = {k: rendezvous([n for n in NAMES if n != gone], k)[0] for k in keys}
    for k in keys:
        if before[k] != gone:
            assert after[k] == before[k]
        else:  # it moves to its second choice
            assert after[k] == rendezvous(NAMES, k)[1]


# ------------------------------------------------------------------ load bound


def test_bound_keeps_the_first_choice_while_it_is_not_overloaded() -> None:
    order = [Load("a", 1, 0), Load("b", 0, 0), Load("c", 0, 0)]
    # average with the new request: 2/3; ceil(1.25 * 2/3) = 1: "a" has 1 in flight -> skipped
    chosen, spilled = bounded(order, 1.25)
    assert [r.name for r in chosen] == ["b", "a", "c"] and spilled
    # with a looser bound it stays: ceil(2.0 * 2/3) = 2
    chosen, spilled = bounded(order, 2.0)
    assert [r.name for r in chosen] == ["a", "b", "c"] and not spilled


def test_bound_off_keeps_rendezvous_order_but_limits_still_apply() -> None:
    order = [Load("a", 9, 0), Load("b", 0, 0)]
    assert [r.name for r in bounded(order, 0)[0]] == ["a", "b"]
    full = [Load("a", 2, 2), Load("b", 0, 2)]  # "a" is at its own concurrency limit
    chosen, spilled = bounded(full, 0)
    assert [r.name for r in chosen] == ["b", "a"] and spilled


def test_bound_with_every_replica_full_waits_at_the_first_choice() -> None:
    order = [Load("a", 2, 2), Load("b", 2, 2)]
    chosen, spilled = bounded(order, 1.25)
    assert [r.name for r in chosen] == ["a", "b"] and not spilled
    assert bounded([], 1.25) == ([], False)


# ------------------------------------------------------------------ health


def test_active_checks_need_their_thresholds_in_a_row() -> None:
    h = Health(healthy_threshold=2, unhealthy_threshold=2)
    assert h.checked(False) is None and h.healthy  # one failure is not enough
    assert h.checked(True) is None and h.bad == 0  # a good check resets the count
    assert h.checked(False) is None
    assert h.checked(False) is False and not h.healthy
    assert h.checked(True) is None and not h.healthy  # one good check is not enough
    assert h.checked(True) is True and h.healthy
    assert h.available(0)


def test_ejection_after_consecutive_failures_for_its_time() -> None:
    h = Health(eject_after=3, eject_seconds=30)
    assert not h.failed(100) and not h.failed(100)
    h.succeeded()  # an answer in between resets the count
    assert not h.failed(100) and not h.failed(100)
    assert h.failed(100)  # the third in a row
    assert h.ejected(100) and h.ejected(129.9) and not h.available(110)
    assert not h.failed(110)  # failures while ejected do not eject again
    assert h.ejections == 1
    assert not h.ejected(130) and h.available(130)  # back after eject_seconds


def test_ejection_off() -> None:
    h = Health(eject_after=0)
    assert not any(h.failed(0) for _ in range(10))
    assert h.available(0)


# ------------------------------------------------------------------ the order of a request


def test_a_chain_goes_back_to_its_replica_while_it_is_available() -> None:
    clock = Clock()
    pool = make_pool(clock)
    home = pool.replicas[1]
    order, outcome = pool.order(Route(home.name, "chain-x"))
    assert order[0] is home and outcome == "hit"
    assert sorted(r.name for r in order) == sorted(r.name for r in pool.replicas)
    home.health.healthy = False
    order, outcome = pool.order(Route(home.name, "chain-x"))
    assert order[0] is not home and outcome == "moved"
    assert order[-1] is home  # tried last: every replica once at most
    home.health.healthy = True
    home.health.ejected_until = clock.now + 5  # ejected: moved too
    assert pool.order(Route(home.name, "chain-x"))[1] == "moved"
    clock.now += 5
    assert pool.order(Route(home.name, "chain-x"))[1] == "hit"


def test_a_replica_the_pool_does_not_know_moves_the_chain() -> None:
    pool = make_pool()
    order, outcome = pool.order(Route("gone:1", "chain-x"))
    assert outcome == "moved" and len(order) == 3


def test_a_new_chain_is_placed_by_rendezvous_and_spills_past_the_bound() -> None:
    pool = make_pool(load_bound=1.0)
    order, outcome = pool.order(Route(None, "chain-y"))
    first = rendezvous([r.name for r in pool.replicas], "chain-y")
    assert [r.name for r in order] == first and outcome == "new"
    pool.by_name[first[0]].in_flight = 1  # average (1 + 1) / 3: cap 1, reached
    order, outcome = pool.order(Route(None, "chain-y"))
    assert order[0].name == first[1] and outcome == "spilled"


def test_a_plain_http_chain_goes_back_to_the_replica_the_pool_remembers() -> None:
    """A conversation keyed by its start (plain HTTP, history resent) has no parent replica:
    the one its last turn went to is remembered, and wins over rendezvous and the bound."""
    pool = make_pool(load_bound=1.0)
    key = chain_key("anonymous", CONTENT, b"first turn")
    first = rendezvous([r.name for r in pool.replicas], key)
    pool.homes[key] = first[2]
    home = pool.by_name[first[2]]
    home.in_flight = 4  # busy: a hit still waits there, as a cached parent's turn does
    order, outcome = pool.order(Route(None, key))
    assert order[0] is home and outcome == "hit"
    home.health.healthy = False  # gone: placed as a new chain, and counted a move
    order, outcome = pool.order(Route(None, key))
    assert order[0].name == first[0] and outcome == "moved"
    # a chain keyed by a connection or by the client's prompt_cache_key is not looked up:
    # its turns carry their parent's replica, and new conversations sharing it may spill
    for kind in (CONNECTION, CLIENT):
        other = chain_key("anonymous", kind, "k")
        pool.homes[other] = home.name
        assert pool.order(Route(None, other))[1] == "new"


def test_the_remembered_chains_are_bounded_most_recent_kept() -> None:
    pool = make_pool()
    keys = [chain_key("anonymous", CONTENT, f"conversation {i}".encode()) for i in range(HOMES + 5)]
    for key in keys:
        pool.homes[key] = pool.replicas[0].name
    assert len(pool.homes) == HOMES
    assert keys[0] not in pool.homes and keys[-1] in pool.homes


def test_affinity_none_takes_the_least_loaded_in_turn() -> None:
    pool = make_pool(affinity="none")
    seen = [pool.order(Route(pool.replicas[0].name, "c"))[0][0].name for _ in range(6)]
    assert Counter(seen) == Counter({r.name: 2 for r in pool.replicas})  # round-robin
    assert pool.order(Route(None, "c"))[1] is None  # no affinity outcome
    pool.replicas[0].in_flight = pool.replicas[1].in_flight = 3
    assert {pool.order(None)[0][0].name for _ in range(4)} == {pool.replicas[2].name}


def test_nothing_available_tries_every_replica_and_is_not_ready() -> None:
    pool = make_pool()
    for r in pool.replicas:
        r.health.healthy = False
    assert not pool.ready
    order, _ = pool.order(Route(None, "c"))
    assert len(order) == 3
    assert pool.pick() in pool.replicas
    assert [s["healthy"] for s in pool.snapshot()] == [False, False, False]


def test_replica_names_are_host_and_port_and_stay_distinct() -> None:
    urls = ["http://a:8000/v1", "http://a:8000/v2", "https://user:pw@b/v1"]
    settings = UpstreamSettings(urls=tuple(urls))
    pool = UpstreamPool(UpstreamClient(urls[0], settings), settings, urls)
    assert [r.name for r in pool.replicas] == ["a:8000", "a:8000#2", "b:443"]
    assert "pw" not in str(pool.snapshot())


@pytest.mark.parametrize(
    ("path", "url"),
    [
        ("models", "http://h:1/v1/models"),
        ("/health", "http://h:1/health"),
        ("../health", "http://h:1/health"),
    ],
)
def test_health_path_resolves_against_the_base_url(path: str, url: str) -> None:
    settings = UpstreamSettings(url="http://h:1/v1", health_path=path)
    pool = UpstreamPool(UpstreamClient("http://h:1/v1", settings), settings, ["http://h:1/v1"])
    assert str(pool.health_url(pool.replicas[0])) == url
