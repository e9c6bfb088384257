"""The model's chat template, rendered here as the model server renders it (docs/tokens.md
"Rendering").

A Jinja chat template is code from the model's files, so it runs in Jinja's immutable
sandbox, as Hugging Face transformers runs it: no attribute of Python internals, no mutation of
the values passed in. The environment is set up the way transformers and llama.cpp's own
template engine (minja) set theirs, so the text is the same byte for byte:

- `trim_blocks` and `lstrip_blocks` on;
- `tojson` writes JSON as Python's `json.dumps` does by default (`", "` and `": "`
  separators, keys in their order, non-ASCII and `<`, `>`, `&` as they are), not Jinja's
  HTML-safe variant;
- `raise_exception(message)` for templates that refuse a conversation, and
  `strftime_now(format)` for templates that print the date;
- `bos_token` and `eos_token` from the server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ClientError
from .template_shape import append_only


class TemplateFailed(ClientError):
    """The chat template could not render this conversation (it raised, or it is broken):
    the request is refused, naming the template and where it failed."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        template: str = "",
        culprit: int | None = None,
        what: str = "",
        why: str = "",
    ) -> None:
        super().__init__(message, code="chat_template_error")
        self.template = template  # its name (where it came from)
        # the index of the message the rendering fails at (None: the generation prompt, or
        # not known), what the template did ("refused", "failed to render") and its words:
        # the token dialect names the client's item from them (core/tokens/dialect.py)
        self.culprit = culprit
        self.what = what
        self.why = why


class _Raised(Exception):
    """The template called `raise_exception`."""


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    return json.dumps(
        value,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        ensure_ascii=ensure_ascii,
    )


def _raise(message: str) -> NoReturn:
    raise _Raised(message)


class ChatTemplate:
    """One chat template, compiled once; `render` is called once per turn."""

    def __init__(
        self,
        source: str,
        *,
        name: str,
        bos_token: str = "",
        eos_token: str = "",
        clock: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.source = source
        self.name = name  # where it came from, for error messages and logs
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.fromtimestamp(clock()).strftime(fmt)
        try:
            self._template = env.from_string(source)
            shape = append_only(env.parse(source))
        except TemplateError as exc:
            raise ValueError(f"chat template {name} does not compile: {exc}") from None
        self.digest = hashlib.sha256(
            b"\0".join(s.encode() for s in (source, bos_token, eos_token))
        ).hexdigest()[:16]
        self.uses_clock = "strftime_now" in source
        # None when a continuation may render only its new messages (template_shape.py);
        # else why it renders the whole conversation every turn
        self.append_only: str | None = shape if shape is not None else self._append_probe()

    def _append_probe(self) -> str | None:
        """The append-only rendering, checked on a probe conversation: a template whose
        shape passed but whose text differs renders whole (a safety net, never expected)."""
        first = {"role": "system", "content": "be brief"}
        more = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]
        try:
            whole = self.render([first, *more])
            head = self.render([first], add_generation_prompt=False)
            history = self.render([first, *more[:2]], add_generation_prompt=False)
            window = self.render([first, more[2]])
        except TemplateFailed:
            return None  # it refuses the probe (no system role, say): the shape decides
        if window.startswith(head) and whole == history + window[len(head) :]:
            return None
        return "its rendering of a probe conversation is not the history's followed by the rest"

    def turn_end(self) -> str:
        """What the template writes right after a model's turn (`<end_of_turn>` and a line
        break, say): found by rendering a probe conversation; "" when it cannot be told."""
        mark = "\x00wsmode-probe\x00"
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}]
        try:
            text = self.render(probe, add_generation_prompt=False)
        except TemplateFailed:
            return ""
        at = text.find(mark)
        return text[at + len(mark) :] if at >= 0 else ""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for `messages` (Chat Completions shape) and `tools`. Raises
        TemplateFailed naming the template and the message it failed on, when known."""
        try:
            return self._render(messages, tools, add_generation_prompt)
        except _Raised as exc:
            what, why = "refused", str(exc)
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            what, why = "failed to render", f"{type(exc).__name__}: {exc}"
        n = self._culprit(messages, tools)
        if n is None:
            at = f"the generation prompt, after {len(messages)} messages"
        else:
            role = messages[n].get("role")
            shown = role if isinstance(role, str) else "no"
            at = f"message {n + 1} of {len(messages)} ({shown} role)"
        raise TemplateFailed(
            f"chat template {self.name} {what} the conversation at {at}: {why}",
            template=self.name,
            culprit=n,
            what=what,
            why=why,
        )

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        return self._template.render(
            messages=messages,
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def _culprit(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> int | None:
        """The index of the message the rendering fails at: the first that fails with those
        before it (a failure path only, so rendering each prefix again is affordable); None
        when every prefix renders (the generation prompt fails)."""
        for n in range(1, len(messages) + 1):
            try:
                self._render(messages[:n], tools, False)
            except Exception:  # any failure of the template's code counts
                return n - 1
        return None


def object_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls' `arguments` strings that hold a JSON object, as that object: llama.cpp
    hands templates the parsed arguments (so `arguments | tojson` prints them), and the text
    must be the same. Changes the messages in place and returns them."""
    for msg in messages:
        calls = msg.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed  # type: ignore[index]
    return messages


def template_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools as llama.cpp hands them to a template: `name`, `description` ("" when
    missing) and `parameters` ({} when missing), in that order, and nothing else (`strict`
    is left out), so that `tool | tojson` prints what the server's own rendering prints.
    Anything not shaped as a function tool is passed as it is."""
    if not tools:
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, Mapping) or "name" not in fn:
            out.append(dict(tool))
            continue
        params = fn.get("parameters")
        function = {
            "name": fn["name"],
            "description": fn.get("description") or "",
            "parameters": params if params is not None else {},
        }
        out.append({"type": "function", "function": function})
    return out


__all__ = ["ChatTemplate", "TemplateFailed", "object_arguments", "template_tools"]
