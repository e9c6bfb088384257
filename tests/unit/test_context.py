"""Checks on arrival: `context_management`, `truncation`, compaction items that must open
(proxy/core/context/manager.py)."""

from __future__ import annotations

from typing import Any

import pytest
from wsmode.core.context.compaction import Compacted, seal
from wsmode.core.errors import ClientError

from tests.support.context import OWNER, SEALER, manager, request
from tests.support.items import user

# ------------------------------------------------------------------ validation


def test_validate_rejects_items_that_do_not_open_and_bad_fields() -> None:
    m = manager()
    item = seal(SEALER, Compacted((), "S", ()), OWNER, "cmp_1")
    m.validate(request([item]), OWNER)
    with pytest.raises(ClientError) as info:
        m.validate(request([item]), "owner-b")
    assert (info.value.code, info.value.param) == ("invalid_encrypted_content", "input")
    bad = {**item, "encrypted_content": item["encrypted_content"][:-4]}
    with pytest.raises(ClientError, match="cannot be used"):
        m.validate(request([bad]), OWNER)
    with pytest.raises(ClientError) as info:
        m.validate(request([user("x")], truncation="sometimes"), OWNER)
    assert info.value.param == "truncation"


@pytest.mark.parametrize(
    ("entries", "param", "code"),
    [
        (
            [{"type": "compaction", "compact_threshold": 999}],
            "context_management[0].compact_threshold",
            "invalid_value",
        ),
        (
            [{"type": "compaction", "compact_threshold": "1000"}],
            "context_management[0].compact_threshold",
            "invalid_type",
        ),
        (
            [{"type": "compaction", "compact_threshold": True}],
            "context_management[0].compact_threshold",
            "invalid_type",
        ),
        ([{"type": "summary"}], "context_management[0].type", "invalid_value"),
        (["compaction"], "context_management[0]", "invalid_type"),
    ],
)
def test_context_management_validation(entries: Any, param: str, code: str) -> None:
    with pytest.raises(ClientError) as info:
        manager().validate(request([user("x")], context_management=entries), OWNER)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_threshold_defaults_to_the_window_minus_the_reserve() -> None:
    m = manager(context_window=8000, output_reserve=1000)
    cm = [{"type": "compaction"}]
    assert m._threshold({"context_management": cm}) == 7000
    assert manager()._threshold({"context_management": cm}) is None
    assert (
        m._threshold({"context_management": [{"type": "compaction", "compact_threshold": 1000}]})
        == 1000
    )
