"""The incremental SSE decoder (proxy/core/sse.py), tested whole, byte by byte and chunked.

The rules are WHATWG HTML "Parsing an event stream": CR, LF and CRLF end lines; a line
starting with ':' is a comment; `data` lines join with LF; one leading space after the colon
is dropped; a blank line dispatches; an unterminated last event is discarded at end of stream.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsmode.core.sse import SSEDecoder, SSEEvent, SSEEventTooLarge

BIG = 1 << 20


def whole(data: bytes, max_event_bytes: int = BIG) -> list[SSEEvent]:
    dec = SSEDecoder(max_event_bytes)
    return dec.feed(data) + dec.close()


def bytewise(data: bytes, max_event_bytes: int = BIG) -> list[SSEEvent]:
    dec = SSEDecoder(max_event_bytes)
    out: list[SSEEvent] = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    return out + dec.close()


def chunked(data: bytes, cuts: list[int], max_event_bytes: int = BIG) -> list[SSEEvent]:
    dec = SSEDecoder(max_event_bytes)
    out: list[SSEEvent] = []
    prev = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out += dec.feed(data[prev:cut])
        prev = cut
    return out + dec.close()


def all_ways(data: bytes) -> list[SSEEvent]:
    """Decode whole and one byte at a time; both must agree, and the common answer is returned."""
    a, b = whole(data), bytewise(data)
    assert a == b
    return a


# ------------------------------------------------------------------ basics


def test_single_event_with_name() -> None:
    data = b'event: response.created\ndata: {"a":1}\n\n'
    assert all_ways(data) == [SSEEvent("response.created", b'{"a":1}')]


def test_event_without_name_has_none() -> None:
    assert all_ways(b"data: x\n\n") == [SSEEvent(None, b"x")]


def test_several_events_in_order() -> None:
    data = b"event: a\ndata: 1\n\nevent: b\ndata: 2\n\ndata: 3\n\n"
    assert all_ways(data) == [SSEEvent("a", b"1"), SSEEvent("b", b"2"), SSEEvent(None, b"3")]


def test_event_name_does_not_carry_over_to_next_event() -> None:
    assert all_ways(b"event: a\ndata: 1\n\ndata: 2\n\n") == [
        SSEEvent("a", b"1"),
        SSEEvent(None, b"2"),
    ]


def test_event_name_without_data_is_not_dispatched_and_is_reset() -> None:
    assert all_ways(b"event: lonely\n\ndata: 2\n\n") == [SSEEvent(None, b"2")]


def test_nothing_before_blank_line_is_dispatched() -> None:
    dec = SSEDecoder(BIG)
    assert dec.feed(b"data: x\n") == []
    assert dec.feed(b"\n") == [SSEEvent(None, b"x")]


# ------------------------------------------------------------------ line endings


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_each_line_ending(eol: bytes) -> None:
    data = b"event: e" + eol + b"data: 1" + eol + b"data: 2" + eol + eol + b"data: 3" + eol + eol
    assert all_ways(data) == [SSEEvent("e", b"1\n2"), SSEEvent(None, b"3")]


def test_mixed_line_endings_in_one_stream() -> None:
    data = b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r"
    assert all_ways(data) == [SSEEvent(None, b"a\nb\nc"), SSEEvent(None, b"d")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    dec = SSEDecoder(BIG)
    assert dec.feed(b"data: x\r") == []
    # the LF completes the CRLF of the data line; it must not count as the blank line
    assert dec.feed(b"\n") == []
    assert dec.feed(b"\r") == [SSEEvent(None, b"x")]
    assert dec.feed(b"\ndata: y\r\n\r\n") == [SSEEvent(None, b"y")]


def test_cr_at_chunk_end_then_empty_chunk_then_lf() -> None:
    dec = SSEDecoder(BIG)
    assert dec.feed(b"data: x\r") == []
    assert dec.feed(b"") == []
    assert dec.feed(b"\n") == []  # still the second half of the CRLF
    assert dec.feed(b"\n") == [SSEEvent(None, b"x")]


def test_cr_at_chunk_end_followed_by_non_lf() -> None:
    dec = SSEDecoder(BIG)
    assert dec.feed(b"data: x\r") == []
    assert dec.feed(b"\rdata: y\n\n") == [SSEEvent(None, b"x"), SSEEvent(None, b"y")]


def test_two_crs_are_two_line_ends() -> None:
    assert all_ways(b"data: x\r\r") == [SSEEvent(None, b"x")]


def test_crlf_cut_at_every_position() -> None:
    data = b"event: e\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n"
    expected = [SSEEvent("e", b"1"), SSEEvent(None, b"2")]
    for cut in range(len(data) + 1):
        assert chunked(data, [cut]) == expected, cut


# ------------------------------------------------------------------ fields


def test_comments_are_ignored() -> None:
    data = b": keep-alive\n\n:\ndata: x\n: inside an event\ndata: y\n\n"
    assert all_ways(data) == [SSEEvent(None, b"x\ny")]


def test_comment_only_stream_yields_nothing() -> None:
    assert all_ways(b": ping\n\n: ping\n\n") == []


def test_multiline_data_joined_with_lf() -> None:
    assert all_ways(b"data: one\ndata: two\ndata: three\n\n") == [
        SSEEvent(None, b"one\ntwo\nthree")
    ]


def test_data_without_space_after_colon() -> None:
    assert all_ways(b"data:{}\n\n") == [SSEEvent(None, b"{}")]


def test_only_one_leading_space_is_dropped() -> None:
    assert all_ways(b"data:  two spaces\n\n") == [SSEEvent(None, b" two spaces")]


def test_trailing_spaces_are_kept() -> None:
    assert all_ways(b"data: x  \n\n") == [SSEEvent(None, b"x  ")]


def test_colon_inside_value_is_kept() -> None:
    assert all_ways(b'data: {"a": "b:c"}\n\n') == [SSEEvent(None, b'{"a": "b:c"}')]


def test_blank_data_value_dispatches_an_empty_event() -> None:
    assert all_ways(b"data:\n\n") == [SSEEvent(None, b"")]
    assert all_ways(b"data: \n\n") == [SSEEvent(None, b"")]


def test_field_name_without_colon_is_a_field_with_empty_value() -> None:
    # `data` alone on a line is the data field with an empty value
    assert all_ways(b"data\n\n") == [SSEEvent(None, b"")]
    assert all_ways(b"data\ndata\n\n") == [SSEEvent(None, b"\n")]


def test_id_retry_and_unknown_fields_are_ignored() -> None:
    data = b"id: 7\nretry: 100\nfoo: bar\nDATA: upper\ndata: x\n\n"
    assert all_ways(data) == [SSEEvent(None, b"x")]


def test_last_event_name_wins() -> None:
    assert all_ways(b"event: a\nevent: b\ndata: x\n\n") == [SSEEvent("b", b"x")]


def test_event_name_without_space() -> None:
    assert all_ways(b"event:response.done\ndata:x\n\n") == [SSEEvent("response.done", b"x")]


def test_done_sentinel_is_an_ordinary_event() -> None:
    assert all_ways(b"data: [DONE]\n\n") == [SSEEvent(None, b"[DONE]")]


def test_data_bytes_are_not_decoded() -> None:
    raw = "data: caf\u00e9 \u2603\n\n".encode()
    assert all_ways(raw) == [SSEEvent(None, "caf\u00e9 \u2603".encode())]


# ------------------------------------------------------------------ end of stream


def test_close_discards_unterminated_event() -> None:
    dec = SSEDecoder(BIG)
    assert dec.feed(b"data: done\n\ndata: partial\n") == [SSEEvent(None, b"done")]
    assert dec.close() == []


def test_close_discards_unterminated_line() -> None:
    dec = SSEDecoder(BIG)
    assert dec.feed(b"data: no newline") == []
    assert dec.close() == []


def test_data_after_close_starts_fresh() -> None:
    dec = SSEDecoder(BIG)
    dec.feed(b"event: stale\ndata: partial\n")
    dec.close()
    assert dec.feed(b"data: new\n\n") == [SSEEvent(None, b"new")]


# ------------------------------------------------------------------ bound


def test_event_at_the_bound_is_accepted() -> None:
    # the bound counts the bytes of the event's lines, terminators excluded
    line = b"data: " + b"x" * 10  # 16 bytes
    assert whole(line + b"\n\n", max_event_bytes=16) == [SSEEvent(None, b"x" * 10)]
    assert bytewise(line + b"\n\n", max_event_bytes=16) == [SSEEvent(None, b"x" * 10)]


def test_event_over_the_bound_raises_whole() -> None:
    dec = SSEDecoder(16)
    with pytest.raises(SSEEventTooLarge):
        dec.feed(b"data: " + b"x" * 11 + b"\n\n")


def test_event_over_the_bound_raises_bytewise() -> None:
    dec = SSEDecoder(16)
    data = b"data: " + b"x" * 11 + b"\n\n"
    with pytest.raises(SSEEventTooLarge):
        for i in range(len(data)):
            dec.feed(data[i : i + 1])


def test_bound_covers_all_lines_of_one_event() -> None:
    dec = SSEDecoder(20)
    with pytest.raises(SSEEventTooLarge):
        dec.feed(b"data: 12345\ndata: 12345\ndata: 12345\n")


def test_bound_resets_between_events() -> None:
    dec = SSEDecoder(16)
    out: list[SSEEvent] = []
    for _ in range(100):
        out += dec.feed(b"data: " + b"y" * 10 + b"\n\n")
    assert out == [SSEEvent(None, b"y" * 10)] * 100


def test_huge_line_without_terminator_raises_before_buffering_it_all() -> None:
    dec = SSEDecoder(1000)
    dec.feed(b"data: " + b"z" * 900)
    with pytest.raises(SSEEventTooLarge):
        dec.feed(b"z" * 200)


def test_huge_single_chunk_without_terminator_raises() -> None:
    dec = SSEDecoder(1000)
    with pytest.raises(SSEEventTooLarge):
        dec.feed(b"data: " + b"z" * 5000)


# ------------------------------------------------------------------ any chunking


STREAM = (
    b": hello\r\n"
    b"event: response.created\r\n"
    b'data: {"type":"response.created","sequence_number":0}\r\n'
    b"\r\n"
    b"event: response.output_text.delta\n"
    b'data: {"delta":"a\\nb"}\n'
    b"\n"
    b"data: line1\r"
    b"data:line2\r"
    b"\r"
    b"data: [DONE]\r\n\r\n"
    b"data: never finished\n"
)
STREAM_EVENTS = [
    SSEEvent("response.created", b'{"type":"response.created","sequence_number":0}'),
    SSEEvent("response.output_text.delta", b'{"delta":"a\\nb"}'),
    SSEEvent(None, b"line1\nline2"),
    SSEEvent(None, b"[DONE]"),
]


def test_reference_stream_whole_and_bytewise() -> None:
    assert all_ways(STREAM) == STREAM_EVENTS


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30))
def test_reference_stream_any_chunking(cuts: list[int]) -> None:
    assert chunked(STREAM, cuts) == STREAM_EVENTS


# JSON-ish text without CR or LF (which cannot occur in a single data line)
_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    max_size=40,
)
_name = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    min_size=1,
    max_size=20,
)
_event = st.tuples(st.none() | _name, st.lists(_text, min_size=1, max_size=4))


def _serialise(events: list[tuple[str | None, list[str]]], eol: bytes) -> bytes:
    out = bytearray()
    for name, lines in events:
        if name is not None:
            out += b"event: " + name.encode() + eol
        for line in lines:
            out += b"data: " + line.encode() + eol
        out += eol
    return bytes(out)


@given(
    events=st.lists(_event, max_size=8),
    eol=st.sampled_from([b"\n", b"\r", b"\r\n"]),
    data=st.data(),
)
def test_property_any_events_any_chunking(
    events: list[tuple[str | None, list[str]]], eol: bytes, data: st.DataObject
) -> None:
    raw = _serialise(events, eol)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=20))
    expected = [SSEEvent(name, "\n".join(lines).encode()) for name, lines in events]
    assert chunked(raw, cuts) == expected


@given(st.binary(max_size=200), st.lists(st.integers(min_value=0, max_value=200), max_size=10))
def test_garbage_is_decoded_or_rejected_with_our_error_only(raw: bytes, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(raw)]
    try:
        got = chunked(raw, cuts, max_event_bytes=64)
    except SSEEventTooLarge:
        return
    # chunking never changes the result
    assert got == whole(raw, max_event_bytes=64)
    assert all(isinstance(e.data, bytes) for e in got)
