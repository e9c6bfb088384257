"""What the console's charts are drawn from (docs/console.md "The charts"): a turn's time to
first event in its parts, read from the run's own clocks (ops/tracking.py), and the
replicas' running token totals the snapshot carries (ops/metrics.py `replica_tokens`)."""

from __future__ import annotations

import orjson
import pytest
from wsmode.config import ConsoleSettings
from wsmode.core.actions import Finished, Outcome, RunCreated, StartUpstream
from wsmode.ops.console_feed import ConsoleFeed
from wsmode.ops.metrics import Metrics
from wsmode.ops.tracking import RunTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def published_turn(clock: Clock, times: dict[str, float]) -> dict[str, object]:
    """One turn through a tracker, its clocks at `times`; the console's event for it."""
    feed = ConsoleFeed(ConsoleSettings(), clock=lambda: 1.0)
    tracker = RunTracker(Metrics(), None, "responses", "o", "conn", None, clock, feed, "c")
    tracker.created(RunCreated(1), received=times["received"], client_bytes=100)
    trace = tracker.start(StartUpstream(1, [b"{}"], "/responses"))
    clock.now = times["sent"]
    trace.sent()
    clock.now = times["first_bytes"]
    trace.chunk(10)
    clock.now = times["handed"]
    trace.delivered()
    clock.now = times["end"]
    tracker.finished(Finished(1, "resp_1", Outcome.COMPLETED, replica="r1"))
    return dict(orjson.loads(feed.ring[-1]))  # the event published last


def test_the_time_to_first_event_is_wsmodes_parts_and_the_model_servers() -> None:
    times = {"received": 10.0, "sent": 10.004, "first_bytes": 10.030, "handed": 10.031, "end": 11}
    first = published_turn(Clock(), times)["first_event"]
    assert isinstance(first, dict)
    assert first["proxy_request"] == pytest.approx(0.004)  # create arrived -> request sent
    assert first["upstream"] == pytest.approx(0.026)  # request sent -> its first bytes
    assert first["proxy_relay"] == pytest.approx(0.001)  # first bytes -> handed to the writer
    assert first["proxy"] == pytest.approx(0.005)  # wsmode's two parts
    assert first["total"] == pytest.approx(0.031)  # the three together


def test_a_turn_with_no_event_from_upstream_has_no_first_event() -> None:
    feed = ConsoleFeed(ConsoleSettings(), clock=lambda: 1.0)
    tracker = RunTracker(Metrics(), None, "responses", "o", "conn", None, console=feed)
    tracker.created(RunCreated(1), received=0.0, client_bytes=50)
    tracker.finished(Finished(1, None, Outcome.REJECTED, refused="moderation"))
    [turn] = [e for e in map(orjson.loads, feed.ring) if e["type"] == "turn"]
    assert turn["first_event"] is None


def test_replica_tokens_are_the_running_totals_of_the_replicas_counters() -> None:
    metrics = Metrics()
    assert metrics.replica_tokens() == {}
    tracker = RunTracker(metrics, None, "responses", "o", "conn", None)
    for replica, prompt, cached in (("a:1", 100, 0), ("a:1", 150, 90), ("b:2", 40, None)):
        tracker.created(RunCreated(1))
        usage = {"input_tokens": prompt, "output_tokens": 5}
        tracker.finished(
            Finished(1, "resp_x", Outcome.COMPLETED, usage, replica=replica, cached_tokens=cached)
        )
    assert metrics.replica_tokens() == {"a:1": (250, 90), "b:2": (40, 0)}
