"""What guards a token chain's ids (proxy/core/tokens/identity.py): the fingerprint's parts,
which of them changed, the vocabulary it records; and the probe's reading of a template whose
generation prompt opens a think block (upstream/token_probe.py `opens_think`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from wsmode.core.tokens.identity import (
    PARTS,
    ServerIdentity,
    changed_parts,
    fingerprint,
    out_of_vocab,
    tokenizer_digest,
    vocab_of,
)
from wsmode.core.tokens.template import ChatTemplate
from wsmode.sim.tokens import TEMPLATE_PATH
from wsmode.upstream.token_probe import opens_think

SERVER = ServerIdentity("llamacpp", "t" * 64, "gemma-3-270m", 262144, tokenizer_digest([2, 105]))
TOOLS = [{"type": "function", "function": {"name": "f"}}]


def test_the_fingerprint_has_every_part_and_says_which_changed() -> None:
    base = fingerprint(SERVER, "my-model", TOOLS)
    assert len(base.split("|")) == len(PARTS)
    assert vocab_of(base) == 262144
    other_tokenizer = replace(SERVER, tokenizer=tokenizer_digest([2, 9]))
    cases = {
        "tokenizer": fingerprint(other_tokenizer, "my-model", TOOLS),
        "served_model": fingerprint(replace(SERVER, served_model="qwen3"), "my-model", TOOLS),
        "vocabulary": fingerprint(replace(SERVER, vocab_size=151936), "my-model", TOOLS),
        "model": fingerprint(SERVER, "another", TOOLS),
        "tools": fingerprint(SERVER, "my-model", None),
    }
    for part, changed in cases.items():
        assert changed_parts(base, changed) == [part]
    assert SERVER.differences(other_tokenizer) == ["tokenizer"]
    assert changed_parts(base, base) == []


def test_model_names_with_the_separator_keep_the_parts_apart() -> None:
    odd = ServerIdentity("vllm", "t", "org|model%7C", 0, "d")
    printed = fingerprint(odd, "a|b", None)
    assert len(printed.split("|")) == len(PARTS)
    assert changed_parts(printed, fingerprint(odd, "a|c", None)) == ["model"]
    assert vocab_of(printed) == 0  # unknown


def test_an_older_fingerprint_differs_in_the_parts_it_lacks() -> None:
    older = "llamacpp|my-model|" + "t" * 64 + "|"
    assert changed_parts(older, fingerprint(SERVER, "my-model", None)) == [
        "served_model",
        "vocabulary",
        "tokenizer",
    ]
    assert vocab_of(older) == 0


@pytest.mark.parametrize(
    ("ids", "vocab", "bad"),
    [
        ([0, 5, 9], 10, None),
        ([0, 5, 10], 10, 10),
        ([3, -1], 10, -1),
        # an unknown vocabulary: the bound is what the token cache can hold (a C int)
        ([3, 10**9], 0, None),
        ([3, 1 << 31], 0, 1 << 31),
        ([-2], 0, -2),
        ([], 10, None),
    ],
)
def test_ids_outside_the_vocabulary(ids: list[int], vocab: int, bad: int | None) -> None:
    assert out_of_vocab(ids, vocab) == bad


THINKING = Path(__file__).parents[1] / "fixtures/templates/qwen3-thinking-like.jinja"
CLOSED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)


@pytest.mark.parametrize(
    ("source", "thinking"),
    [
        (THINKING.read_text(), True),  # Qwen3-Thinking: the prompt opens the block
        (CLOSED, False),  # Qwen3 with thinking off: an empty block, closed
        (TEMPLATE_PATH.read_text(), False),  # no think block at all
    ],
    ids=["opens", "closed", "none"],
)
def test_a_generation_prompt_that_ends_inside_think(source: str, thinking: bool) -> None:
    assert opens_think(ChatTemplate(source, name="t")) is thinking
