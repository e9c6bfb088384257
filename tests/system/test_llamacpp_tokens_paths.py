"""Everything that works over chat, on the token path (`upstream.api = "tokens"`) against a
REAL llama.cpp server: forks on two lanes, steer, cancel, `generate: false` warm-ups,
truncation, compaction, the console's id counts, log probabilities, a template that refuses,
and a history past 8K tokens.

The model is `llamacpp_tiny_vocab` (random weights with Gemma 3's real 262,144-token
tokenizer and the `turns-with-tools.jinja` template: fast prefill, and llama.cpp reuses its
whole prompt cache). Exactness is read from what llama.cpp itself was sent and streamed back,
through the recording relay (tests/support/recording_relay.py), never from wsmode's own
state; the relay also holds a stream mid-way, so a steer or a cancel meets a generation
llama.cpp is still running. Sampling is greedy; the model's wording is never asserted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

from tests.support.console_feed import read_events, short
from tests.support.helpers import create, recv, seconds, send, until, until_terminal, user
from tests.support.llamacpp_server import TEMPLATE_FILE, TURN_TIMEOUT
from tests.support.llamacpp_tokens import (
    ProxyFactory,
    chain_report,
    common_prefix,
    completed,
    continues,
    counts,
    detokenize,
    divergences,
    head,
    ids_counted,
    metrics_for,
    root,
    token_proxy,
    tokenize,
    turn,
)
from tests.support.recording_relay import Completion, RecordingRelay, recording_relay
from tests.support.token_path import token_record, trajectory

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(seconds(600))]

GREEDY = {"model": "tiny-vocab", "temperature": 0, "max_output_tokens": 8}
ZERO = {"fingerprint": 0.0, "history_changed": 0.0, "generation_rerendered": 0.0}


async def completion_of(
    px: Any, relay: RecordingRelay, rid: str, headers: dict[str, str] | None = None
) -> Completion:
    """The `/completion` llama.cpp served for response `rid`: the one whose prompt is the
    response's stored prompt; the ids wsmode stored as generated are the ones llama.cpp
    streamed for it."""
    prompt, generated = await trajectory(px, rid, headers)
    found = [c for c in relay.recording.completions if c.prompt == prompt]
    assert len(found) == 1, f"{len(found)} completions with the prompt of {rid}"
    assert generated == found[0].tokens and generated
    return found[0]


def diverged(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in ZERO}


def cache_n(c: Completion) -> int:
    assert c.timings is not None, "llama.cpp sent no timings"
    return int(c.timings["cache_n"])


# ---------------------------------------------------------------- forks on two lanes


async def test_a_fork_on_two_lanes_starts_each_child_from_the_ids_llamacpp_generated(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    server = root(llamacpp_tiny_vocab)
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with connect(px.ws) as ws:
            parent = await completed(ws, **GREEDY, input="the parent turn")
            # two children of one parent, each on its own lane, in flight together
            for lane, text in (("L", "left child"), ("R", "right child")):
                await send(
                    ws,
                    create(**GREEDY, input=text, previous_response_id=parent["id"], stream_id=lane),
                )
            ends: dict[str, dict[str, Any]] = {}
            while len(ends) < 2:
                ev = await recv(ws, timeout=TURN_TIMEOUT)
                assert ev.get("stream_id") in ("L", "R"), ev
                if ev["type"] in ("response.completed", "response.incomplete", "error"):
                    ends[ev["stream_id"]] = ev
            assert all(e["type"] != "error" for e in ends.values()), ends
            left, right = ends["L"]["response"], ends["R"]["response"]
            grandchild = await completed(
                ws, **GREEDY, input="left again", previous_response_id=left["id"], stream_id="L"
            )
        metrics = await metrics_for(px, relay)
        p, lc, rc, gc = [
            await completion_of(px, relay, r["id"]) for r in (parent, left, right, grandchild)
        ]
    assert len(relay.recording.completions) == 4
    # each child's prompt is the parent's prompt and the ids llama.cpp generated for it
    assert continues(lc, p) and continues(rc, p), chain_report([p, lc])
    assert lc.prompt != rc.prompt
    # the grandchild goes on from its own branch, and holds nothing of the other one
    assert continues(gc, lc), chain_report([lc, gc])
    assert "right child" not in await detokenize(server, gc.prompt)
    assert diverged(divergences(metrics)) == ZERO
    assert ids_counted(metrics, "reused") == len(head(p)) * 2 + len(head(lc))
    # llama.cpp found the parent's ids in its cache for every turn after it
    assert all(cache_n(c) >= len(head(p)) - 1 for c in (lc, rc, gc)), [lc.timings, rc.timings]


# ---------------------------------------------------------------- steer and cancel


async def test_a_steer_mid_stream_starts_the_successor_from_the_ids_llamacpp_generated(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    """A steer accepted while llama.cpp is generating (the relay holds its stream): the
    response runs to the end of its output item (here its one message, at the stream's
    end), and wsmode starts the successor with the steering input, whose prompt is the
    steered prompt, the ids llama.cpp generated, then the steering text."""
    server = root(llamacpp_tiny_vocab)
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with connect(px.ws) as ws:
            first = await completed(ws, **GREEDY, input="a first turn")
            relay.hold(2)
            await send(
                ws,
                create(
                    **{**GREEDY, "max_output_tokens": 16},
                    input="write at length",
                    previous_response_id=first["id"],
                ),
            )
            rid = (await recv(ws, timeout=TURN_TIMEOUT))["response"]["id"]
            await asyncio.wait_for(relay.held.wait(), seconds(TURN_TIMEOUT))
            steer = {"type": "response.steer", "previous_response_id": rid, "input": "stop here"}
            await send(ws, steer)
            while (ev := await recv(ws, timeout=TURN_TIMEOUT))["type"] != "response.steer.accepted":
                assert ev["type"] not in ("error", "response.steer.failed"), ev
            relay.let_go()
            steered = (await until_terminal(ws, timeout=TURN_TIMEOUT))[-1]
            successor = (await until_terminal(ws, timeout=TURN_TIMEOUT))[-1]
        metrics = await metrics_for(px, relay)
        calls = relay.recording.completions
        assert len(calls) == 3
        held, after = calls[1], calls[2]
        assert held.prompt == (await trajectory(px, rid))[0]
        assert after.prompt == (await trajectory(px, successor["response"]["id"]))[0]
    # its one item ended with the stream: the response ended as it would have unsteered,
    # with the whole message, and llama.cpp's whole generation is what the successor starts
    # from
    assert steered["response"]["id"] == rid
    assert [i["type"] for i in steered["response"]["output"]] == ["message"], steered
    assert steered["response"]["incomplete_details"] != {"reason": "steered"}
    assert held.timings is not None and not held.left
    assert successor["type"] in ("response.completed", "response.incomplete"), successor
    assert successor["response"]["previous_response_id"] == rid
    assert continues(held, calls[0]) and continues(after, held), chain_report(calls)
    assert (await detokenize(server, after.prompt[len(head(held)) :])).count("stop here") == 1
    assert diverged(divergences(metrics)) == ZERO
    assert cache_n(after) >= len(head(held)) - 1


async def test_a_cancel_mid_stream_stops_llamacpp_and_keeps_the_parent(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    server = root(llamacpp_tiny_vocab)
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with connect(px.ws) as ws:
            parent = await completed(ws, **GREEDY, input="the parent turn")
            relay.hold(2)
            await send(
                ws,
                create(
                    **{**GREEDY, "max_output_tokens": 64},
                    input="a long answer",
                    previous_response_id=parent["id"],
                ),
            )
            await asyncio.wait_for(relay.held.wait(), seconds(TURN_TIMEOUT))
            while (await recv(ws, timeout=TURN_TIMEOUT))["type"] != "response.output_text.delta":
                pass
            await send(ws, {"type": "response.cancel"})
            end = (await until_terminal(ws, timeout=TURN_TIMEOUT))[-1]
            cancelled = relay.recording.completions[1]
            # wsmode left the stream: the relay's request to llama.cpp ended with it
            await until(lambda: cancelled.left, 10, message="the generate request went on")
            relay.let_go()
            before = await counts(px)
            after = await completed(
                ws, **GREEDY, input="carry on", previous_response_id=parent["id"]
            )
        status, _ = await token_record(px, end["response"]["id"])
        p = await completion_of(px, relay, parent["id"])
        a = await completion_of(px, relay, after["id"])
        used = await counts(px)
    assert end["type"] == "response.incomplete", end
    assert end["response"]["status"] == "cancelled"
    assert status == 404  # a cancelled response is not kept
    assert cancelled.timings is None  # llama.cpp's final event never came through
    assert continues(cancelled, p)
    # the next turn from the parent: the parent's ids, exactly, then the new text
    assert continues(a, p), chain_report([p, a])
    assert (await detokenize(server, a.prompt[len(head(p)) :])).count("carry on") == 1
    assert used["reused"] - before["reused"] == len(head(p))
    assert diverged(used) == ZERO
    assert cache_n(a) >= len(head(p)) - 1


# ---------------------------------------------------------------- generate: false


async def test_a_warmup_joins_the_next_prompt_after_llamacpps_ids(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    server = root(llamacpp_tiny_vocab)
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with connect(px.ws) as ws:
            first = await completed(ws, **GREEDY, input="first real turn")
            warm = (
                await turn(
                    ws,
                    **GREEDY,
                    input="warm-up context",
                    generate=False,
                    previous_response_id=first["id"],
                )
            )[-1]
            assert warm["type"] == "response.completed" and warm["response"]["output"] == []
            assert len(relay.recording.completions) == 1, "a warm-up never reaches llama.cpp"
            real = await completed(
                ws, **GREEDY, input="the real question", previous_response_id=warm["response"]["id"]
            )
        metrics = await metrics_for(px, relay)
        f = await completion_of(px, relay, first["id"])
        r = await completion_of(px, relay, real["id"])
    assert len(relay.recording.completions) == 2
    assert continues(r, f), chain_report([f, r])
    rest = await detokenize(server, r.prompt[len(head(f)) :])
    assert "first real turn" not in rest
    assert rest.index("warm-up context") < rest.index("the real question")
    assert ids_counted(metrics, "reused") == len(head(f))
    assert diverged(divergences(metrics)) == ZERO
    assert cache_n(r) >= len(head(f)) - 1


# ---------------------------------------------------------------- truncation, compaction

# Gemma's tokenizer writes a fact in about 120 ids (`size` 35): the window is passed at the
# fourth turn; facts twice as long pass the compaction's threshold (1000, the least) at about
# the fifth
WINDOW = 500
THRESHOLD = 1000


def fact(i: int, size: int = 35) -> str:
    return f"fact-{i} the user notes that item {i} matters " + "and more detail " * size


BOS = 2  # Gemma's <bos>


def text_of_rest(text: str) -> str:
    """The rendered conversation: the detokenised prompt without its BOS."""
    return text.removeprefix("<bos>")


async def test_truncation_drops_the_oldest_turn_and_reuses_the_ids_before_it(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    """`truncation: "auto"` with a small `upstream.context_window`: once the conversation
    passes it, the oldest turns are left out, a counted `history_changed`; wsmode tokenises
    again only what changed and keeps the ids of the turns after it, and the prompt it sends
    is exactly llama.cpp's own tokenising of the rendered conversation."""
    server = root(llamacpp_tiny_vocab)
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay, upstream__context_window=WINDOW)
        previous: str | None = None
        dropped: list[int] = []
        async with connect(px.ws) as ws:
            for i in range(6):
                before = await counts(px)
                response = await completed(
                    ws,
                    **GREEDY,
                    input=[user(fact(i))],
                    truncation="auto",
                    previous_response_id=previous,
                )
                await metrics_for(px, relay)
                used = {k: v - before[k] for k, v in (await counts(px)).items()}
                c = await completion_of(px, relay, response["id"])
                text = await detokenize(server, c.prompt)
                assert fact(i) in text
                # exact: the ids sent are what llama.cpp makes of the text they stand for
                assert c.prompt[0] == BOS
                assert await tokenize(server, text_of_rest(text), add_special=True) == c.prompt
                if i:
                    # llama.cpp's cache has at least the start the prompt shares with the
                    # previous prompt and generation
                    prev = relay.recording.completions[-2]
                    shared = common_prefix(c.prompt, head(prev))
                    assert cache_n(c) >= min(shared, int(used["reused"])) - 1
                if used["history_changed"]:
                    # the dropped turn, and the first message now another one: each counted
                    assert used["history_changed"] >= 1
                    assert used["reused"] > 0  # the turns after the dropped one kept their ids
                    assert "fact-0 " not in text  # the oldest turn was dropped
                    dropped.append(i)
                else:
                    assert all(fact(j) in text for j in range(i + 1))
                    if i:
                        assert continues(c, prev) and used["reused"] == len(head(prev))
                assert used["generation_rerendered"] == used["fingerprint"] == 0
                previous = response["id"]
    assert dropped, "the conversation never passed the window"
    assert dropped == list(range(dropped[0], 6))  # from then on every turn drops one


async def test_a_compaction_starts_a_new_token_chain_on_llamacpp(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    """The compacted turn's prompt is tokenised afresh (nothing reused, no divergence: a new
    chain), and the turn after it continues the compacted turn's ids exactly."""
    server = root(llamacpp_tiny_vocab)
    cm = [{"type": "compaction", "compact_threshold": THRESHOLD}]
    async with recording_relay(server) as relay:
        # the random model writes a summary as long as it may: a short one fits the window
        px = await token_proxy(
            proxy_factory,
            relay,
            upstream__context_window=1600,
            compaction__summary_max_output_tokens=32,
        )
        previous: str | None = None
        compacted: str | None = None
        after: str | None = None
        async with connect(px.ws) as ws:
            for i in range(10):
                before = await counts(px)
                response = await completed(
                    ws,
                    **GREEDY,
                    input=[user(fact(i, 70))],
                    context_management=cm,
                    previous_response_id=previous,
                )
                await metrics_for(px, relay)
                used = {k: v - before[k] for k, v in (await counts(px)).items()}
                assert diverged(used) == ZERO, (i, used)
                if compacted is not None:
                    after = response["id"]
                    break
                if response["output"][0]["type"] == "compaction":
                    compacted = response["id"]
                    c = await completion_of(px, relay, compacted)
                    assert used["reused"] == 0 and used["tokenized"] == len(c.prompt)
                    assert "fact-0 " not in await detokenize(server, c.prompt)
                previous = response["id"]
        assert compacted is not None and after is not None, "no compaction happened"
        c = await completion_of(px, relay, compacted)
        a = await completion_of(px, relay, after)
    assert continues(a, c), chain_report([c, a])
    assert cache_n(a) >= len(head(c)) - 1


# ---------------------------------------------------------------- the console


async def test_the_console_feed_counts_the_ids_llamacpp_was_sent_and_reused(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    async with recording_relay(root(llamacpp_tiny_vocab)) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{px.served.base}/console/feed") as feed,
        ):
            assert feed.status == 200
            async with connect(px.ws) as ws:
                one = await completed(ws, **GREEDY, input="one")
                two = await completed(ws, **GREEDY, input="two", previous_response_id=one["id"])
            events = await read_events(
                feed, lambda evs: sum(e["type"] == "turn" for e in evs) >= 2, timeout=30
            )
        first, second = relay.recording.completions
    shown = {e["response_id"]: e for e in events if e["type"] == "turn"}
    a, b = shown[short(one["id"])], shown[short(two["id"])]
    assert a["ids_sent"] == len(first.prompt) and a["ids_reused"] == 0
    assert b["ids_sent"] == len(second.prompt)
    assert b["ids_reused"] == len(head(first))
    assert a["divergence"] is None is b["divergence"]


# ---------------------------------------------------------------- log probabilities


async def test_a_trajectory_has_llamacpps_log_probability_per_generated_id(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    """Asked for (`include: ["message.output_text.logprobs"]`), wsmode asks llama.cpp for
    them (`n_probs`) and `GET /v1/responses/{id}/tokens` answers one per generated id, the
    values llama.cpp streamed; not asked for, null, and llama.cpp is not asked."""
    async with recording_relay(root(llamacpp_tiny_vocab)) as relay:
        px = await token_proxy(proxy_factory, relay)
        async with connect(px.ws) as ws:
            asked = await completed(
                ws, **GREEDY, input="hello", include=["message.output_text.logprobs"]
            )
            plain = await completed(ws, **GREEDY, input="again", previous_response_id=asked["id"])
        with_probs, without = relay.recording.completions
        _, doc = await token_record(px, asked["id"])
        _, plain_doc = await token_record(px, plain["id"])
    assert with_probs.request.get("n_probs", 0) >= 1
    assert "n_probs" not in without.request
    probs = doc["generation_log_probs"]
    assert doc["generation_token_ids"] == with_probs.tokens
    assert isinstance(probs, list) and len(probs) == len(with_probs.tokens) > 0
    assert probs == with_probs.logprobs
    assert all(isinstance(p, float) and p <= 0.0 for p in probs)
    assert plain_doc["generation_log_probs"] is None
    assert continues(without, with_probs)  # and the chain went on exactly


# ---------------------------------------------------------------- a template that refuses


async def test_a_template_that_raises_names_itself_and_llamacpp_is_not_asked(
    tmp_path: Path, llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    refusing = tmp_path / "refusing.jinja"
    refusing.write_text(
        "{%- for m in messages -%}{%- if m.content is string and 'nope' in m.content -%}"
        "{{ raise_exception('nope is not allowed') }}{%- endif -%}{%- endfor -%}"
        + TEMPLATE_FILE.read_text()
    )
    async with recording_relay(root(llamacpp_tiny_vocab)) as relay:
        px = await token_proxy(proxy_factory, relay, upstream__chat_template_file=str(refusing))
        async with connect(px.ws) as ws:
            parent = await completed(ws, **GREEDY, input="fine")
            sent = len(relay.recording.completions), len(relay.recording.tokenize)
            events = await turn(ws, **GREEDY, input="nope", previous_response_id=parent["id"])
            assert [e["type"] for e in events] == ["error"], events
            err = events[0]
            assert (len(relay.recording.completions), len(relay.recording.tokenize)) == sent
            after = await completed(
                ws, **GREEDY, input="fine again", previous_response_id=parent["id"]
            )
        p = await completion_of(px, relay, parent["id"])
        a = await completion_of(px, relay, after["id"])
    assert err["status"] == 400 and err["error"]["code"] == "chat_template_error"
    assert str(refusing) in err["error"]["message"]
    assert "nope is not allowed" in err["error"]["message"]
    assert continues(a, p)  # the refusal left the conversation as it was


# ---------------------------------------------------------------- a long history

LONG = 8_192  # ids in the first prompt, at least (Gemma writes a note in about 26)


async def test_a_history_past_8k_ids_costs_each_turn_only_its_new_text(
    llamacpp_tiny_vocab: str, proxy_factory: ProxyFactory
) -> None:
    """A first turn of more than 8K ids, then three short ones: each later prompt is the
    previous prompt and llama.cpp's generated ids exactly, llama.cpp evaluates only the new
    ids, and wsmode asks llama.cpp to tokenise only each turn's new text."""
    server = root(llamacpp_tiny_vocab)
    notes = " ".join(
        f"Note {i}: the parcel for depot {i} leaves at {i % 12 + 1} o'clock from gate {i % 7}."
        for i in range(330)
    )
    async with recording_relay(server) as relay:
        px = await token_proxy(proxy_factory, relay)
        startup = len(relay.recording.tokenize)
        previous: str | None = None
        async with connect(px.ws) as ws:
            for text in (notes, "Which depot leaves at 3?", "And at 5?", "Thanks."):
                response = await completed(ws, **GREEDY, input=text, previous_response_id=previous)
                previous = response["id"]
        metrics = await metrics_for(px, relay)
    calls = relay.recording.completions
    asked = relay.recording.tokenize[startup:]
    assert len(calls) == 4 and len(calls[0].prompt) >= LONG, len(calls[0].prompt)
    assert all(continues(calls[k], calls[k - 1]) for k in range(1, 4)), chain_report(calls)
    for k in range(1, 4):
        assert cache_n(calls[k]) >= len(head(calls[k - 1])) - 1, (k, calls[k].timings)
        assert calls[k].timings is not None and calls[k].timings["prompt_n"] < 64
    # the new text only: the end of the model's turn, the input, the generation prompt
    assert len(asked[0]["content"]) > len(notes)
    assert all(len(a["content"]) < 200 for a in asked[1:]), [a["content"] for a in asked]
    assert diverged(divergences(metrics)) == ZERO
    assert ids_counted(metrics, "reused") == sum(len(head(c)) for c in calls[:-1])
