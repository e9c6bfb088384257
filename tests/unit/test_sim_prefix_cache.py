"""The simulated model's prefix cache (sim/prefix_cache.py): block-wise prefix hits, the last
token always computed, partial blocks never kept, least recently used blocks forgotten first
(the deepest block of a prefix before its first), and a prompt's size in tokens equal to the
usage the sim reports."""

from __future__ import annotations

import pytest
from wsmode.config import ConfigError, load_settings
from wsmode.sim.model import count_tokens
from wsmode.sim.prefix_cache import PrefixCache, prompt_bytes

BLOCK = 4  # tokens per block in these tests: 16 bytes


def _tokens(n: int, fill: str = "a") -> bytes:
    """`n` tokens of prompt (4 bytes each)."""
    return (fill * 4 * n).encode()


def _cache(blocks: int) -> PrefixCache:
    return PrefixCache(capacity_tokens=blocks * BLOCK, block_tokens=BLOCK)


def test_a_new_prompt_finds_nothing_and_its_repeat_finds_its_whole_blocks() -> None:
    cache = _cache(100)
    prompt = _tokens(10)  # two full blocks and half of a third
    first = cache.lookup(prompt)
    assert (first.tokens, first.cached) == (10, 0)
    cache.insert(prompt)
    again = cache.lookup(prompt)
    assert (again.tokens, again.cached) == (10, 8)  # the partial block is never cached
    assert cache.tokens == 8
    assert (cache.lookups, cache.prompt_tokens, cache.cached_tokens) == (2, 20, 8)


def test_a_longer_turn_finds_the_previous_prompt_up_to_its_last_full_block() -> None:
    cache = _cache(100)
    turn1 = _tokens(9, "a")
    cache.insert(turn1)
    turn2 = turn1 + _tokens(7, "b")  # the same history, then new input
    assert cache.lookup(turn2).cached == 8  # blocks 1-2; block 3 was partial in turn 1
    cache.insert(turn2)
    turn3 = turn2 + _tokens(1, "c")
    assert cache.lookup(turn3).cached == 16


def test_the_last_token_is_always_computed() -> None:
    """A prompt cached whole (exactly two blocks) still prefills its last block, as vLLM
    recomputes the last token for its logits; one token more finds both blocks."""
    cache = _cache(100)
    prompt = _tokens(8)
    cache.insert(prompt)
    assert cache.lookup(prompt).cached == 4
    assert cache.lookup(prompt + _tokens(1, "z")).cached == 8


def test_a_block_is_keyed_by_its_whole_prefix() -> None:
    """The same later blocks behind a different first block are not hits."""
    cache = _cache(100)
    cache.insert(_tokens(4, "x") + _tokens(8, "s"))
    other = _tokens(4, "y") + _tokens(8, "s") + _tokens(1, "t")
    assert cache.lookup(other).cached == 0
    cache.insert(other)
    assert cache.tokens == 4 * 3 + 4 * 3  # nothing shared


def test_the_least_recently_used_prompt_is_forgotten_first() -> None:
    cache = _cache(4)
    a, b, c = (_tokens(8, f) + _tokens(1, "!") for f in "abc")  # two blocks each
    cache.insert(a)
    cache.insert(b)
    assert cache.lookup(a).cached == 8  # a is now the most recent
    cache.insert(c)  # needs two blocks: b's go
    assert cache.lookup(b).cached == 0
    assert cache.lookup(a).cached == 8
    assert cache.lookup(c).cached == 8
    assert cache.tokens == 16 and cache.evictions == 2


def test_within_a_prefix_the_deepest_blocks_go_first() -> None:
    cache = _cache(3)
    long = _tokens(12, "l") + _tokens(1, "!")  # three blocks
    cache.insert(long)
    cache.insert(_tokens(4, "o") + _tokens(1, "!"))  # one more block: one of long's goes
    assert cache.lookup(long).cached == 8  # its first two blocks are still reachable


def test_a_prompt_larger_than_the_cache_keeps_its_beginning() -> None:
    cache = _cache(2)
    huge = _tokens(20, "h") + _tokens(1, "!")
    cache.insert(huge)
    assert cache.tokens == 8
    assert cache.lookup(huge).cached == 8


def test_no_capacity_caches_nothing() -> None:
    cache = PrefixCache(capacity_tokens=0, block_tokens=BLOCK)
    cache.insert(_tokens(40))
    assert cache.lookup(_tokens(40)).cached == 0 and cache.tokens == 0


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PrefixCache(100, block_tokens=0)


def test_the_prompt_counts_the_tokens_the_usage_reports_and_ignores_ids() -> None:
    items = [
        {"type": "message", "role": "user", "content": "hello there, model"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hi!", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    body = {"instructions": "be brief", "input": items}
    prompt = prompt_bytes(body["instructions"], items)
    assert len(prompt) % 4 == 0 and len(prompt) // 4 == count_tokens(body)
    renamed = [{**items[0]}, {**items[1], "id": "msg_2", "status": "incomplete"}, *items[2:]]
    assert prompt_bytes("be brief", renamed) == prompt
    # the role is part of the prompt: the same text said by another role is another prompt
    assert prompt_bytes(None, [{**items[0], "role": "system"}]) != prompt_bytes(None, items[:1])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("prefix_cache_tokens", -1),
        ("prefill_tokens_per_second", -5.0),
        ("prefix_cache_block_tokens", 0),
    ],
)
def test_the_settings_refuse_impossible_values(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=key):
        load_settings(None, {}, {f"sim.{key}": value})


def test_the_cache_is_off_by_default() -> None:
    sim = load_settings(None, {}, {}).sim
    assert (sim.prefix_cache_tokens, sim.prefill_tokens_per_second) == (0, 0.0)
