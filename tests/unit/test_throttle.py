"""The per-connection read rate: token buckets that go into debt instead of refusing."""

from __future__ import annotations

from wsmode.ops.throttle import Bucket, ReadRate


def test_a_burst_then_one_message_per_interval() -> None:
    b = Bucket(rate=10, burst=10, now=0.0)
    assert [b.take(1, 0.0) for _ in range(10)] == [0.0] * 10  # the burst
    assert b.take(1, 0.0) == 0.1  # one past it: wait a tenth of a second
    assert b.take(1, 0.0) == 0.2  # the debt adds up while the taker does not wait
    assert b.take(1, 0.3) == 0.0  # refilled by the wait
    assert b.take(1, 10.0) == 0.0 and b.tokens == 9  # never more than the burst


def test_off_and_both_bounds() -> None:
    assert Bucket(rate=0, burst=1, now=0.0).take(10**9, 0.0) == 0.0
    r = ReadRate(frames_per_second=0, bytes_per_second=1000, max_message=4000, now=0.0)
    assert r.wait(4000, 0.0) == 0.0  # one largest message always fits the burst
    assert r.wait(1000, 0.0) == 1.0
    r = ReadRate(frames_per_second=2, bytes_per_second=0, max_message=1, now=0.0)
    assert [r.wait(10**6, 0.0) for _ in range(3)] == [0.0, 0.0, 0.5]
