"""The console's feed (proxy/ops/console_feed.py) and its static files (proxy/console/static/).

The feed keeps a bounded ring of recent events, lets a bounded number of pages read, drops a
page that falls too far behind instead of waiting for it, and carries no payload text unless
`console.show_content` is on. The page loads nothing from outside the proxy.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from wsmode.config import ConfigError, ConsoleSettings, load_settings
from wsmode.console.routes import enabled
from wsmode.core.actions import Finished, Outcome
from wsmode.core.errors import ClientError, UpstreamError
from wsmode.ops.console_feed import ConsoleFeed, input_texts, output_texts
from wsmode.ops.metrics import Metrics
from wsmode.ops.tracking import RunTracker

STATIC = Path(__file__).resolve().parents[2] / "proxy" / "console" / "static"


def feed(**overrides: object) -> ConsoleFeed:
    return ConsoleFeed(ConsoleSettings(**overrides), clock=lambda: 1.0)  # type: ignore[arg-type]


def turn(n: int) -> dict[str, object]:
    return {"type": "turn", "run": n}


def test_the_ring_keeps_only_the_last_ring_size_events() -> None:
    f = feed(ring_size=3)
    for n in range(10):
        f.publish(turn(n))
    joined = f.subscribe(lambda: None)
    assert joined is not None
    _, backlog = joined
    assert [orjson.loads(e)["run"] for e in backlog] == [7, 8, 9]


def test_pages_beyond_max_subscribers_are_refused() -> None:
    f = feed(max_subscribers=2)
    assert f.subscribe(lambda: None) is not None
    assert f.subscribe(lambda: None) is not None
    assert f.subscribe(lambda: None) is None
    assert len(f.subscribers) == 2


def test_a_page_that_falls_behind_is_dropped_and_the_others_keep_reading() -> None:
    f = feed(subscriber_queue=4)
    hung_up: list[str] = []
    slow = f.subscribe(lambda: hung_up.append("slow"))
    quick = f.subscribe(lambda: hung_up.append("quick"))
    assert slow is not None and quick is not None
    for n in range(4):
        f.publish(turn(n))
    assert [orjson.loads(e)["run"] for e in quick[0].take()] == [0, 1, 2, 3]
    f.publish(turn(4))  # the slow page has taken nothing: one past its queue
    assert slow[0].dropped and hung_up == ["slow"]
    assert not slow[0].pending  # its queue is freed at once
    assert f.subscribers == {quick[0]} and f.dropped == 1
    assert [orjson.loads(e)["run"] for e in quick[0].take()] == [4]
    f.publish(turn(5))  # publishing goes on, the dropped page is not offered anything
    assert not slow[0].pending


def test_errors_carry_no_message_unless_show_content() -> None:
    hidden, shown = feed(), feed(show_content=True)
    body = b'{"error":{"code":"invalid_api_key","message":"the key sk-secret is wrong"}}'
    for f in (hidden, shown):
        f.http_error("GET", "/console/feed", 401, body)
    [hidden_error], [shown_error] = hidden.errors, shown.errors
    assert hidden_error["code"] == "invalid_api_key" and "message" not in hidden_error
    assert b"sk-secret" not in b"".join(hidden.ring)
    assert shown_error["message"] == "the key sk-secret is wrong"


def test_a_failed_turn_reports_the_status_and_code_of_its_error() -> None:
    f = feed(show_content=True)
    tracker = RunTracker(Metrics(), None, "responses", "o", "conn", None, console=f, source="c")
    upstream = UpstreamError("bad", status=502, code="upstream_error")
    tracker.finished(Finished(1, "resp_1", Outcome.FAILED, error=upstream))
    refused = ClientError("no such call", code="no_tool_call")
    tracker.finished(Finished(2, None, Outcome.REJECTED, refused="no_tool_call", error=refused))
    tracker.finished(Finished(3, None, Outcome.REJECTED, refused="moderation"))
    got = [(e["where"], e["status"], e["code"], e.get("message")) for e in f.errors]
    assert got == [
        ("c resp_1", 502, "upstream_error", "bad"),
        ("c run 2", 400, "no_tool_call", "no such call"),
        ("c run 3", None, "moderation", None),
    ]


def test_text_of_items_and_of_a_terminal_event() -> None:
    items = [
        b'{"type":"message","role":"user","content":"hello"}',
        b'{"type":"message","role":"user","content":[{"type":"input_text","text":"world"}]}',
        b'{"type":"function_call_output","call_id":"c","output":"42"}',
    ]
    assert input_texts(items) == "hello\nworld\n42"
    done = {"output": [{"content": [{"type": "output_text", "text": "hi!"}]}]}
    assert output_texts(done) == "hi!"
    assert output_texts(None) == "" and output_texts({"output": "?"}) == ""
    assert len(input_texts([orjson.dumps({"content": "x" * 10_000})])) == 2000


@pytest.mark.parametrize(
    ("host", "setting", "on"),
    [
        ("127.0.0.1", "auto", True),
        ("localhost", "auto", True),
        ("::1", "auto", True),
        ("0.0.0.0", "auto", False),
        ("192.0.2.7", "auto", False),
        ("0.0.0.0", "true", True),
        ("127.0.0.1", "false", False),
    ],
)
def test_auto_turns_the_console_on_only_on_loopback(host: str, setting: str, on: bool) -> None:
    settings = load_settings(None, {}, {"server.host": host, "console.enabled": setting})
    assert enabled(settings) is on


def test_console_settings_are_checked() -> None:
    assert load_settings(None, {"WSMODE_CONSOLE_ENABLED": "true"}).console.enabled is True
    assert load_settings(None, {"WSMODE_CONSOLE_ENABLED": "auto"}).console.enabled == "auto"
    with pytest.raises(ConfigError, match=r"console\.enabled"):
        load_settings(None, {"WSMODE_CONSOLE_ENABLED": "sometimes"})
    with pytest.raises(ConfigError, match=r"console\.subscriber_queue"):
        load_settings(None, {}, {"console.subscriber_queue": 0})


# ---- the static files: nothing loaded from outside the proxy

# any absolute or protocol-relative URL, in HTML attributes, CSS or script
_EXTERNAL = re.compile(
    r"(?i)\b(?:https?|wss?|ftp):|(?<![:\w])//[\w.-]+\.[a-z]{2,}|@import|@font-face"
)
# what the page may reference: its own files on this origin
_REFERENCES = re.compile(r"""(?i)(?:src|href)\s*=\s*["']([^"']+)["']""")
# the one URL-shaped string a script may hold: the SVG namespace's name, which
# createElementNS takes and nothing fetches (charts.js)
SVG_NS = '"http://www.w3.org/2000/svg"'


def test_the_static_files_reference_nothing_outside_the_proxy() -> None:
    files = sorted(STATIC.iterdir())
    names = {f.name for f in files}
    assert names == {"index.html", "sidecar.html", "console.js", "charts.js", "console.css"}
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.name == "charts.js":
            assert text.count(SVG_NS) == 1  # its constant, SVG_NS
            text = text.replace(SVG_NS, '""')
        assert _EXTERNAL.findall(text) == [], path.name
        assert "url(" not in text, path.name  # no CSS image or font fetched
    for page in ("index.html", "sidecar.html"):  # the proxy's page, the sidecar's
        refs = _REFERENCES.findall((STATIC / page).read_text(encoding="utf-8"))
        assert sorted(refs) == [
            "/console/charts.js",
            "/console/console.css",
            "/console/console.js",
            "data:,",
        ], page
    for name in ("console.js", "charts.js"):  # feed data is text, never HTML
        script = (STATIC / name).read_text(encoding="utf-8")
        for markup in ("innerHTML", "outerHTML", "insertAdjacentHTML", "DOMParser", "eval("):
            assert markup not in script, (name, markup)
    assert re.findall(r"fetch\(([^,)]+)", script) == []  # charts.js reads nothing
    script = (STATIC / "console.js").read_text(encoding="utf-8")
    assert re.findall(r"fetch\(([^,)]+)", script) == ["FEED"]


def test_the_scanner_finds_external_references() -> None:
    for bad in (
        '<script src="https://cdn.example.com/x.js">',
        "@import 'x.css';",
        "@font-face { src: local(x) }",
        '<link href="//fonts.example.com/css">',
        "new WebSocket('wss://example.com')",
    ):
        assert _EXTERNAL.findall(bad), bad
