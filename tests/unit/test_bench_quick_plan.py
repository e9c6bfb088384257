"""The quick plan measures what every target reads, in the regime the full plan does
(docs/bench.md "Quick and smoke runs"): no timing, only the plan's shape."""

from __future__ import annotations

import pytest
from wsmode.bench import affinity, agent
from wsmode.bench.procs import TOKENIZE_US_PER_TOKEN
from wsmode.bench.runner import FULL, QUICK, SMOKE


def test_quick_plan_has_every_cell_the_targets_read() -> None:
    cells = {(c.rtt_ms, c.uplink_mbit): c for c in QUICK.cells()}
    assert QUICK.main == FULL.main and cells[QUICK.main].sidecar
    assert set(cells) == {(r, u) for r in QUICK.rtts for u in QUICK.uplinks}
    assert all(c.reps >= 2 for c in cells.values())  # every cell's target has a spread
    relay = QUICK.relay
    assert min(relay.connections) == 1 and max(relay.connections) == 1000
    assert relay.paced_streams == 1000 and relay.rounds >= 2
    # the events per turn the CPU per event divides a turn's fixed cost by: as in the full run
    assert relay.fast_events == FULL.relay.fast_events
    assert relay.paced_seconds * relay.paced_tps == FULL.relay.paced_seconds * FULL.relay.paced_tps
    assert 1000 in QUICK.scale and QUICK.store_sizes == FULL.store_sizes


def test_quick_agent_turns_resend_what_the_full_loop_does_per_turn() -> None:
    """Each timed turn re-sends about the full loop's average history: the quick loop's
    larger first prompt goes before the clock, its turns are the full loop's turns."""
    full, quick = FULL.profile, QUICK.profile
    assert quick.prompt_before_clock and not full.prompt_before_clock
    assert quick.tool_output_bytes == full.tool_output_bytes
    assert (quick.ttft_ms, quick.tokens_per_second, quick.output_tokens) == (
        full.ttft_ms,
        full.tokens_per_second,
        full.output_tokens,
    )
    per_turn = full.tool_output_bytes + 600  # a tool output and its call, about
    full_mean = full.first_prompt_bytes + per_turn * full.tool_calls / 2
    quick_mean = quick.first_prompt_bytes + per_turn * (quick.tool_calls + 1) / 2
    assert abs(quick_mean - full_mean) <= full_mean * 0.05


def test_quick_affinity_keeps_the_default_regime() -> None:
    d, q = affinity.DEFAULT, affinity.QUICK
    assert (q.replicas, q.turns, q.cache_share) == (d.replicas, d.turns, d.cache_share)
    assert (q.instructions_tokens, q.turn_tokens, q.output_tokens) == (
        d.instructions_tokens,
        d.turn_tokens,
        d.output_tokens,
    )
    speed = q.prefill_tokens_per_second / d.prefill_tokens_per_second
    assert q.tokens_per_second / d.tokens_per_second == speed  # every time as much shorter
    assert d.ttft_ms / q.ttft_ms == speed
    share = q.cache_tokens() / q.working_set_tokens() - d.cache_tokens() / d.working_set_tokens()
    assert abs(share) < 1e-3  # each cache the same part of the working set


def test_the_agent_loop_and_the_tokens_scenario_charge_one_tokenising_cost() -> None:
    """Every plan's model tokenises at the same cost per token as the tokens scenario's."""
    costs = {p.profile.tokenize_us_per_token for p in (FULL, QUICK, SMOKE)}
    costs |= {p.tokens.tokenize_us_per_token for p in (FULL, QUICK, SMOKE)}
    assert costs == {TOKENIZE_US_PER_TOKEN} and TOKENIZE_US_PER_TOKEN > 0


def test_quick_affinity_runs_every_contender_a_target_reads() -> None:
    """The targets compare wsmode-affinity with the balancer and the ideal; only the full
    profile adds wsmode-none."""
    read = {"round-robin", "wsmode-affinity", "ideal"}
    assert set(affinity.QUICK.contenders()) == read
    assert set(affinity.DEFAULT.contenders()) == read | {"wsmode-none"}
    assert affinity.DEFAULT.contenders()[-1] == affinity.QUICK.contenders()[-1] == "ideal"


def test_the_ideal_sends_a_turns_new_input_at_the_uplink_rate() -> None:
    """8 KiB of new input takes 6.6 ms at 10 Mbit/s and 66 us at 1 Gbit/s: no contender can
    send it faster, so the ideal pays it."""
    assert agent.ideal_upload_s(8192, 10.0) == pytest.approx(0.0065536)
    assert agent.ideal_upload_s(8192, 1000.0) == pytest.approx(0.000065536)
    assert agent.ideal_upload_s(0, 10.0) == 0.0
