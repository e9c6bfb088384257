"""`response.create` validation and the upstream body (proxy/core/request.py, docs/protocol.md
"response.create")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from wsmode.core.errors import ClientError
from wsmode.core.request import check_stream_id, parse_create, upstream_body


def create(**fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": "m", "input": [], **fields}


def rejected(body: dict[str, Any]) -> ClientError:
    with pytest.raises(ClientError) as info:
        parse_create(body)
    return info.value


# ------------------------------------------------------------------ required fields


def test_missing_model() -> None:
    body = create()
    del body["model"]
    err = rejected(body)
    assert (err.code, err.param, err.status, err.type) == (
        "missing_required_parameter",
        "model",
        400,
        "invalid_request_error",
    )


def test_empty_model_counts_as_missing() -> None:
    err = rejected(create(model=""))
    assert (err.code, err.param) == ("missing_required_parameter", "model")


def test_missing_input() -> None:
    body = create()
    del body["input"]
    err = rejected(body)
    assert (err.code, err.param) == ("missing_required_parameter", "input")


def test_null_input_counts_as_missing() -> None:
    err = rejected(create(input=None))
    assert (err.code, err.param) == ("missing_required_parameter", "input")


def test_missing_input_is_allowed_for_a_warmup() -> None:
    body = create(generate=False)
    del body["input"]
    req = parse_create(body)
    assert req.generate is False and req.input_items == ()


def test_missing_input_is_allowed_with_a_prompt() -> None:
    body = create(prompt={"id": "pmpt_1"})
    del body["input"]
    req = parse_create(body)
    assert req.input_items == () and req.settings["prompt"] == {"id": "pmpt_1"}


# ------------------------------------------------------------------ input


@pytest.mark.parametrize("value", [42, {"role": "user"}, True, 1.5])
def test_input_not_string_or_list(value: Any) -> None:
    err = rejected(create(input=value))
    assert (err.code, err.param) == ("invalid_type", "input")


@pytest.mark.parametrize("item", ["text", 1, None, ["nested"]])
def test_input_item_not_object(item: Any) -> None:
    err = rejected(create(input=[{"type": "message", "role": "user", "content": "ok"}, item]))
    assert (err.code, err.param) == ("invalid_type", "input[1]")


def test_string_input_becomes_one_user_message() -> None:
    req = parse_create(create(input="hello"))
    assert [orjson.loads(i) for i in req.input_items] == [
        {"type": "message", "role": "user", "content": "hello"}
    ]


def test_list_input_items_are_serialised_once_each() -> None:
    items = [
        {"type": "message", "role": "user", "content": "a"},
        {"type": "function_call_output", "call_id": "c1", "output": "{}"},
    ]
    req = parse_create(create(input=items))
    assert req.input_items == tuple(orjson.dumps(i) for i in items)


# ------------------------------------------------------------------ field types


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", 3),
        ("instructions", ["x"]),
        ("previous_response_id", 5),
        ("store", "yes"),
        ("store", 1),
        ("stream", "true"),
        ("generate", 0),
        ("background", "true"),
        ("parallel_tool_calls", "no"),
        ("tools", {"type": "function"}),
        ("include", "reasoning"),
        ("metadata", []),
        ("client_metadata", "x"),
        ("text", "plain"),
        ("reasoning", "high"),
        ("context_management", {}),
        ("tool_choice", 1),
        ("truncation", False),
        ("temperature", "hot"),
        ("top_p", [1]),
        ("max_output_tokens", 1.5),
        ("max_output_tokens", "10"),
        ("max_tool_calls", 2.0),
    ],
)
def test_wrong_type(field: str, value: Any) -> None:
    err = rejected(create(**{field: value}))
    assert (err.code, err.param, err.status) == ("invalid_type", field, 400)


@pytest.mark.parametrize("field", ["temperature", "top_p", "max_output_tokens", "max_tool_calls"])
@pytest.mark.parametrize("value", [True, False])
def test_boolean_is_not_a_number(field: str, value: bool) -> None:
    err = rejected(create(**{field: value}))
    assert (err.code, err.param) == ("invalid_type", field)


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0), ("temperature", 0.7), ("top_p", 1), ("max_output_tokens", 100)],
)
def test_numbers_are_accepted(field: str, value: Any) -> None:
    assert parse_create(create(**{field: value})).settings[field] == value


@pytest.mark.parametrize(
    "field", ["instructions", "previous_response_id", "store", "tools", "temperature", "metadata"]
)
def test_null_is_accepted_for_optional_fields(field: str) -> None:
    req = parse_create(create(**{field: None}))
    if field in ("previous_response_id", "store"):  # rebuilt by the proxy, never forwarded
        assert field not in req.settings
    else:
        assert req.settings[field] is None


# ------------------------------------------------------------------ WS-mode rules


def test_background_true_is_unsupported() -> None:
    err = rejected(create(background=True))
    assert (err.code, err.param, err.status) == ("unsupported_parameter", "background", 400)


def test_background_false_is_accepted_and_not_forwarded() -> None:
    assert "background" not in parse_create(create(background=False)).settings


@pytest.mark.parametrize("value", ["", "has space", "a/b", "x" * 257, "\u00e9", 7, ["a"], True])
def test_invalid_stream_id(value: Any) -> None:
    err = rejected(create(stream_id=value))
    assert (err.code, err.param, err.status) == ("invalid_stream_id", "stream_id", 400)
    # the offending value is never echoed back
    assert "stream_id" not in err.event()
    if isinstance(value, str) and value:
        assert value not in err.message


@pytest.mark.parametrize("value", ["a", "x" * 256, "Lane_1.v-2", "0"])
def test_valid_stream_id(value: str) -> None:
    assert parse_create(create(stream_id=value)).lane == value
    assert check_stream_id(value) == value


def test_stream_id_none_is_the_default_lane() -> None:
    assert parse_create(create()).lane is None
    assert parse_create(create(stream_id=None)).lane is None


def test_stream_id_must_match_fully_not_only_a_prefix() -> None:
    with pytest.raises(ClientError):
        check_stream_id("ok\n")


def test_conversation_with_previous_response_id_is_rejected() -> None:
    err = rejected(create(previous_response_id="resp_1", conversation="conv_1"))
    assert (err.code, err.param, err.status) == ("invalid_value", "conversation", 400)


def test_conversation_alone_is_kept_in_settings() -> None:
    assert parse_create(create(conversation="conv_1")).settings["conversation"] == "conv_1"


def test_empty_previous_response_id_means_none() -> None:
    assert parse_create(create(previous_response_id="")).previous_response_id is None


# ------------------------------------------------------------------ parsed values


def test_parsed_fields() -> None:
    body = create(
        stream_id="lane",
        previous_response_id="resp_1",
        store=False,
        generate=True,
        instructions="be brief",
    )
    req = parse_create(body)
    assert req.lane == "lane"
    assert req.previous_response_id == "resp_1"
    assert req.generate is True and req.store is False and req.model == "m"
    assert req.body is body


def test_defaults_store_true_and_generate_true() -> None:
    req = parse_create(create())
    assert req.store is True and req.generate is True and req.previous_response_id is None


def test_store_null_means_default_true() -> None:
    assert parse_create(create(store=None)).store is True


def test_ws_only_and_rebuilt_fields_are_stripped_from_settings() -> None:
    body = create(
        stream_id="lane",
        generate=True,
        client_metadata={"traceparent": "00-abc"},
        stream=True,
        background=False,
        previous_response_id="resp_1",
        store=False,
        instructions="be brief",
        tools=[{"type": "function", "name": "f"}],
        temperature=0.5,
        some_future_field={"kept": True},
    )
    assert parse_create(body).settings == {
        "model": "m",
        "instructions": "be brief",
        "tools": [{"type": "function", "name": "f"}],
        "temperature": 0.5,
        "some_future_field": {"kept": True},
    }


def test_parse_does_not_modify_the_client_body() -> None:
    body = create(stream_id="lane", input="hi", stream=True)
    snapshot = orjson.dumps(body)
    parse_create(body)
    assert orjson.dumps(body) == snapshot


# ------------------------------------------------------------------ upstream body


def joined(pieces: list[bytes]) -> Any:
    assert all(isinstance(p, bytes) for p in pieces)
    return orjson.loads(b"".join(pieces))


def test_upstream_body_with_items() -> None:
    items = [orjson.dumps({"type": "message", "role": "user", "content": "a"}), b'{"n":2}']
    pieces = upstream_body({"model": "m", "tools": []}, {"stream": True, "store": False}, items)
    assert joined(pieces) == {
        "model": "m",
        "tools": [],
        "stream": True,
        "store": False,
        "input": [{"type": "message", "role": "user", "content": "a"}, {"n": 2}],
    }


def test_upstream_body_items_are_passed_through_as_the_same_bytes() -> None:
    item = b'{"type":"message","content":"x"}'
    pieces = upstream_body({"model": "m"}, {}, [item])
    assert any(p is item for p in pieces)


def test_upstream_body_without_items() -> None:
    assert joined(upstream_body({"model": "m"}, {"stream": True}, [])) == {
        "model": "m",
        "stream": True,
        "input": [],
    }


def test_upstream_body_with_empty_settings_and_extra() -> None:
    assert joined(upstream_body({}, {}, [])) == {"input": []}
    assert joined(upstream_body({}, {}, [b"1", b"2"])) == {"input": [1, 2]}


def test_upstream_body_with_empty_settings_but_extra() -> None:
    assert joined(upstream_body({}, {"store": False}, [b"{}"])) == {"store": False, "input": [{}]}


def test_upstream_body_extra_overrides_settings() -> None:
    assert joined(upstream_body({"stream": False, "model": "m"}, {"stream": True}, [])) == {
        "stream": True,
        "model": "m",
        "input": [],
    }


def test_upstream_body_accepts_a_generator_of_items() -> None:
    gen = (orjson.dumps({"i": i}) for i in range(3))
    assert joined(upstream_body({"model": "m"}, {}, gen))["input"] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_parse_then_upstream_body_round_trip() -> None:
    req = parse_create(
        create(
            input="hi",
            stream_id="lane",
            generate=True,
            client_metadata={"k": "v"},
            stream=True,
            instructions="x",
        )
    )
    body = joined(upstream_body(req.settings, {"stream": True, "store": False}, req.input_items))
    assert body == {
        "model": "m",
        "instructions": "x",
        "stream": True,
        "store": False,
        "input": [{"type": "message", "role": "user", "content": "hi"}],
    }
