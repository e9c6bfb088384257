"""The token dialect, `upstream.api = "tokens"` (docs/tokens.md): the proxy renders the chat
template, keeps each response's ids, sends ids to the engine's generate endpoint and parses the
generated text into Responses events itself.

A turn's request is a `TokenPrompt`: the parent's kept ids (core/tokens/chain.py) and the
text no kept ids cover, in gaps (normally one: the new text), found by rendering only the new
messages where the template allows (core/tokens/incremental.py) and lining the parent's chain
up with the text (core/tokens/walk.py). The runner asks the server to tokenise each gap,
reports their ids (`PromptTokenized`) and sends the prompt; the stream is read by
`TokenStream`, which feeds the engine's deltas through the output parser
(core/tokens/parsers.py) into the canonical event sequence (core/dialects/builder.py).

Summaries of a compaction, which are the proxy's own requests, go over the server's Chat
Completions endpoint (every engine serves one): `body`, `path` and `translator` are the Chat
dialect's.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api_objects import usage_of
from ..context.render import context_length_exceeded
from ..conversation import CachedResponse
from ..dialects.builder import BuiltStream, OutputBuilder
from ..dialects.chat import ChatDialect, ChatStream, namespace_names
from ..dialects.chat_request import messages as chat_messages
from ..dialects.chat_settings import chat_settings
from ..errors import ClientError
from ..ids import new_id as mint_id
from ..sse import SSEEvent
from ..urls import ROOT
from .chain import (
    Continuation,
    Gap,
    Segment,
    TokenTurn,
    TokenUse,
    fresh,
    ids_json,
    new_ids,
    prompt_json,
    turn_after,
)
from .engine import EngineUsage, Generated, Sampling, TokenEngine, protocol_error, sampling_of
from .harmony import HarmonyParser
from .identity import ServerIdentity, log_change, out_of_vocab, vocabulary
from .identity import fingerprint as fingerprint_of
from .incremental import Rendered, RenderMemo, render_turn
from .naming import named
from .parsers import (
    BrokenCall,
    CallArgs,
    CallPiece,
    CallStart,
    OutputParser,
    ReasoningEnd,
    ReasoningPiece,
    TextPiece,
)
from .template import ChatTemplate, TemplateFailed, template_tools
from .walk import continue_after, continue_from

log = logging.getLogger("wsmode.tokens")


@dataclass(frozen=True, slots=True)
class TokenSetup:
    """What the token path knows of its server, found at start-up (upstream/token_probe.py)."""

    engine: TokenEngine
    template: ChatTemplate
    parser: Callable[[], OutputParser]  # a new parser per response
    vocab_size: int = 0  # 0: unknown
    context_window: int = 0  # tokens; 0: unknown
    model: str | None = None  # the server's model name, for engines that want one
    turn_end: str = ""  # what the template writes after a model's turn (ChatTemplate.turn_end)
    # the special token that starts a turn, as text and id (`<start_of_turn>`, 105): a turn's
    # new ids are kept in pieces cut before it (core/tokens/chain.py `split_at_turns`)
    turn_marker: tuple[str, int] | None = None
    # the parser's tags that are one special token each, by id: written back into the text
    # when the server streams such a token without its text (`formats.markers`)
    tags: Mapping[int, str] = field(default_factory=dict)
    # special tokens a generation may end with that end the model's turn themselves, so
    # nothing need follow them in the history (harmony's `<|call|>`): `formats.closing`
    closing: tuple[str, ...] = ()
    tokenizer: str = ""  # the digest of the probe text's ids (core/tokens/identity.py)
    starts_in_think: bool = False  # the generation prompt opens a think block

    @property
    def identity(self) -> ServerIdentity:
        """The server's parts of the fingerprint."""
        return ServerIdentity(
            self.engine.name,
            self.template.digest,
            self.model or "",
            self.vocab_size,
            self.tokenizer,
        )


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """One turn's prompt, to be completed by the runner: tokenise each gap's text, then
    send."""

    engine: TokenEngine
    plan: Continuation
    sampling: Sampling
    marker: tuple[str, int] | None = None  # the turn marker the new ids are cut at (chain.py)
    context_window: int = 0  # the server's (llama.cpp's n_ctx); 0: unknown
    vocab_size: int = 0  # the server's; 0: unknown
    # what this turn's text was rendered from, for the next turn (core/tokens/incremental.py)
    rendered: Rendered | None = None
    parent: TokenTurn | None = None  # the token turn it continues (its memo entry goes)

    def tokenize_bodies(self) -> list[bytes | None]:
        """One tokenise request per gap (None for a gap without text). Only text at the very
        start of the prompt is tokenised with the model's BOS, as the chat endpoint does."""
        plan = self.plan
        out: list[bytes | None] = []
        for i, part in enumerate(plan.parts):
            if isinstance(part, Gap):
                start = i == 0 and not plan.kept
                body = (
                    self.engine.tokenize_body(part.text, add_special=start) if part.text else None
                )
                out.append(body)
        return out

    def new_ids(self, answers: list[bytes | None]) -> list[list[int]]:
        """Each gap's ids from its tokenise answer (None: it had no text). Raises
        `protocol_error` on an id outside the server's vocabulary."""
        out: list[list[int]] = []
        for gap, answer in zip(self.plan.gaps, answers, strict=True):
            if answer is None:
                out.append([])
                continue
            ids = self.engine.tokenize_ids(answer)
            if (bad := out_of_vocab(ids, self.vocab_size)) is not None:
                raise protocol_error(
                    f"upstream tokenised the prompt into token id {bad}, outside "
                    f"{vocabulary(self.vocab_size)} ({self.engine.name} "
                    f"{self.engine.tokenize_path} `tokens`)"
                )
            out.append(new_ids(gap, ids))
        return out

    def over_window(self, ids: list[list[int]]) -> ClientError | None:
        """The refusal of a prompt of the kept ids and `ids` that does not fit the server's
        own context window with room for one generated token: the server would refuse it,
        so it is not asked. (`upstream.context_window` is the context manager's, from its
        estimates: a planning bound, not this one.)"""
        n = self.plan.kept_ids + sum(map(len, ids))
        window = self.context_window
        return context_length_exceeded(n, window) if window and n >= window else None

    def body(self, ids: list[list[int]]) -> bytes:
        new = [ids_json(gap) for gap in ids]
        return self.engine.generate_body(prompt_json(self.plan, *new), self.sampling)


def fingerprint(setup: TokenSetup, settings: Mapping[str, Any]) -> str:
    """What must be equal for ids to be reused (core/tokens/identity.py): the engine, the
    client's model, the template (and its special tokens), the tool set, the served model,
    the vocabulary and the tokenizer."""
    return fingerprint_of(setup.identity, settings.get("model"), settings.get("tools"))


class TokenStream(BuiltStream):
    """The Responses events of one generate stream; keeps what the model generated."""

    def __init__(
        self,
        request: dict[str, Any],
        patch: dict[str, Any],
        *,
        engine: TokenEngine,
        parser: OutputParser,
        names: dict[str, tuple[str, str]],
        model: str | None,
        clock: Callable[[], float],
        new_id: Callable[[str], str],
        tags: Mapping[int, str] | None = None,
        vocab_size: int = 0,
        renders: RenderMemo | None = None,
    ) -> None:
        super().__init__(request, patch, clock=clock, new_id=new_id)
        self._vocab = vocab_size
        self._renders = renders
        self._engine_stream = engine.stream()
        self._parser = parser
        # the harmony parser reads the generated ids; the others read their text
        self._id_parser = parser if isinstance(parser, HarmonyParser) else None
        self._names = names
        self._model = model
        self._tags = tags or {}
        self._calls = 0
        self._open_call: tuple[str, int] | None = None  # the call whose arguments stream
        self._thinks = 0  # think blocks closed so far (each one reasoning item)
        # ended before the server's end: the text after the tool calls is not wanted, and the
        # driver stops the upstream request (`CancelUpstream`)
        self.cut_short = False
        # a tool call that did not parse: the response ends incomplete, with this reason
        # ("" when none of the API's reasons fits: `incomplete_details` is then null)
        self._broken: str | None = None
        self.text: list[str] = []  # the generated text, as streamed
        self.ids = array("i")  # the generated ids, as reported
        self.logprobs = array("d")
        self.finish: str | None = None
        self.prompt: TokenPrompt | None = None  # set by the planner, with `fingerprint`
        self.fingerprint = ""
        # each gap's ids, as the server tokenised them (`PromptTokenized`)
        self.prompt_ids: list[list[int]] | None = None

    def feed(self, event: SSEEvent) -> list[bytes]:
        if self.outcome is not None:
            return []
        return self._take(self._engine_stream.feed(event))

    def eof(self) -> list[bytes]:
        if self.outcome is not None:
            return []
        return self._take(self._engine_stream.eof())

    def use(self) -> TokenUse | None:
        """What the prompt took from the cache, once it is known (`Finished.tokens`)."""
        if self.prompt is None or self.prompt_ids is None:
            return None
        plan = self.prompt.plan
        return TokenUse(plan.kept_ids, sum(map(len, self.prompt_ids)), plan.divergences)

    def turn(self) -> TokenTurn | None:
        """The response's tokens, once its prompt is known: what was generated so far, for a
        response cut short too (a steer's boundary), since those ids are what the server
        holds (chain.py `turn_after`)."""
        if self.prompt is None or self.prompt_ids is None:
            return None
        turn = turn_after(
            self.prompt.plan,
            self.prompt_ids,
            self.prompt.marker,
            self.fingerprint,
            Segment.of("".join(self.text), self.ids),
            logprobs=self.logprobs if self.logprobs else None,
            eos=self.finish == "stop" and self._broken is None and not self.cut_short,
        )
        if self._renders is not None and self.prompt.rendered is not None:
            self._renders.keep(turn, self.prompt.rendered, self.prompt.parent)
        return turn

    # ------------------------------------------------------------ internals

    def _take(self, gen: Generated) -> list[bytes]:
        if (bad := out_of_vocab(gen.ids, self._vocab)) is not None:  # before any event
            raise protocol_error(
                f"upstream generated token id {bad}, outside {vocabulary(self._vocab)}"
            )
        out = self._start()
        if len(gen.ids) == 1 and (tag := self._tags.get(gen.ids[0])) and tag not in gen.text:
            gen.text = tag + gen.text  # a tag the server streamed as an id without its text
        if gen.text:
            self.text.append(gen.text)
            if self._id_parser is None:
                out += self._pieces(self._parser.feed(gen.text))
        if gen.ids and self._id_parser is not None:
            out += self._pieces(self._id_parser.feed_ids(gen.ids))
        if gen.ids:
            self.ids.extend(gen.ids)
        if gen.logprobs:
            self.logprobs.extend(gen.logprobs)
        if gen.finish is None and self._parser.after_calls_text:
            # the model went on after its tool calls (a base model, with no stop sequence):
            # the response is its calls, and the rest is not waited for (`cut_short`)
            self.cut_short = True
            prompt = self.prompt.plan.kept_ids if self.prompt is not None else 0
            prompt += len(self.prompt_ids or ())
            gen = Generated(finish="stop", usage=EngineUsage(prompt, len(self.ids), 0))
        if gen.finish is None:
            return out
        self.finish = gen.finish
        out += self._pieces(self._parser.end())
        usage = None
        if gen.usage is not None:
            u = gen.usage
            usage = usage_of(u.prompt_tokens, u.completion_tokens, cached=u.cached_tokens)
        if self._broken is not None:
            return out + self._end("incomplete", usage, None, self._broken or None)
        if gen.finish == "length":
            return out + self._end("incomplete", usage, None, "max_output_tokens")
        return out + self._end("completed", usage, None, None)

    def _start(self) -> list[bytes]:
        if self._builder is not None:
            return []
        return self._begin(self._new_id("resp"), None, self._model)

    def _pieces(self, pieces: list[Any]) -> list[bytes]:
        b = self._builder
        assert b is not None
        out: list[bytes] = []
        for p in pieces:
            if isinstance(p, TextPiece):
                out += b.text(p.text)
            elif isinstance(p, ReasoningPiece):
                out += b.reasoning(p.text, source=("think", self._thinks))
            elif isinstance(p, ReasoningEnd):  # an item boundary now, not at the next text
                out += b.close_source(("think", self._thinks))
                self._thinks += 1
            elif isinstance(p, CallStart):  # its arguments stream from now on
                key = self._open_call = ("call", self._calls)
                self._calls += 1
                out += self._call_open(b, key, p.name)
            elif isinstance(p, CallArgs):
                if self._open_call is not None:
                    out += b.call_args(self._open_call, p.text)
            elif isinstance(p, CallPiece) and p.streamed and self._open_call is not None:
                # parsed, and its arguments are the deltas sent: `.done` only now
                key, self._open_call = self._open_call, None
                out += b.close_source(key)
            elif isinstance(p, CallPiece):
                key = ("call", self._calls)
                self._calls += 1
                out += self._call_open(b, key, p.name)
                out += b.call_args(key, p.arguments)
                out += b.close_source(key)  # whole when parsed: done at once
            elif isinstance(p, BrokenCall):
                # never a completed call with broken arguments: a call already streaming
                # ends incomplete; else its text is shown as the model wrote it. The response
                # ends incomplete (cut by the limit: that reason; else no reason of the
                # API's fits, so none is given)
                if self._open_call is not None:
                    key, self._open_call = self._open_call, None
                    out += b.abandon_call(key)
                else:
                    out += b.text(p.raw)
                if self._broken is None:
                    self._broken = "max_output_tokens" if p.reason == "unterminated" else ""
        return out

    def _call_open(self, b: OutputBuilder, key: tuple[str, int], name: str) -> list[bytes]:
        namespace = None
        if name in self._names:
            namespace, name = self._names[name]
        return b.call_open(key, call_id=self._new_id("call"), name=name, namespace=namespace)


class TokenDialect:
    """`upstream.api = "tokens"`: ids to the engine; the Chat dialect for summaries."""

    name = "tokens"

    def __init__(
        self,
        chat: ChatDialect,
        *,
        clock: Callable[[], float] = lambda: 0.0,
        new_id: Callable[[str], str] = mint_id,
    ) -> None:
        self.chat = chat
        self.setup: TokenSetup | None = None  # found at start-up (upstream/token_probe.py)
        self.not_ready: str | None = "the token engine has not been probed yet"
        self._clock = clock
        self._new_id = new_id
        # what each chain's last prompt was rendered from (core/tokens/incremental.py), under
        # the translation memo's bound: it holds the same translated messages
        self.renders = RenderMemo(chat.options.translation_cache_bytes)

    # ---- the Dialect protocol, for the proxy's own requests (summaries)

    @property
    def path(self) -> str:
        return self.chat.path

    def body(
        self, settings: dict[str, Any], extra: dict[str, Any], items: list[bytes]
    ) -> list[bytes]:
        return self.chat.body(settings, extra, items)

    def translator(self, patch: dict[str, Any], request: dict[str, Any]) -> ChatStream:
        return self.chat.translator(patch, request)

    def retry_elsewhere(self, status: int, stream: object) -> bool:
        return False

    # ---- a client's turn

    def ready(self, setup: TokenSetup) -> None:
        self.setup, self.not_ready = setup, None
        t = setup.template
        if t.append_only is None:
            log.info("chat template %s: a continuation renders only its new messages", t.name)
        else:
            log.info(
                "chat template %s renders the whole conversation every turn: %s",
                t.name,
                t.append_only,
            )

    def unready(self, reason: str) -> None:
        """The token path cannot serve now (turns fail with 503 `upstream_not_ready`)."""
        self.setup, self.not_ready = None, reason

    def stream(self, patch: dict[str, Any], request: dict[str, Any]) -> TokenStream:
        setup = self._setup()
        return TokenStream(
            request,
            patch,
            engine=setup.engine,
            parser=setup.parser(),
            names=namespace_names(request.get("tools")),
            model=setup.model,
            clock=self._clock,
            new_id=self._new_id,
            tags=setup.tags,
            vocab_size=setup.vocab_size,
            renders=self.renders,
        )

    def prompt(
        self,
        settings: Mapping[str, Any],
        items: list[bytes],
        parent: CachedResponse | None,
        extra: Mapping[str, Any],
        new_items: int = 0,
    ) -> tuple[TokenPrompt, str]:
        """The turn's prompt, continuing `parent`'s ids (None: a new token chain), and its
        fingerprint. `new_items`: how many of `items`, at their end, are the request's own
        input (the rest is the history), for naming the item a template fails on. Raises
        ClientError (the template failed, the path is not ready)."""
        setup = self._setup()
        opts = self.chat.options
        head, _ = chat_settings(settings, opts)
        raw = settings.get("instructions")
        instructions = raw if isinstance(raw, str) else None
        msgs = chat_messages(items, opts, self.chat.memo, instructions)
        tools = template_tools(head.get("tools"))
        print_ = fingerprint(setup, settings)
        turn = parent.tokens if parent is not None else None
        turn_end = setup.turn_end
        if turn is not None and setup.closing and turn.generated.text.endswith(setup.closing):
            turn_end = ""  # the model's own end of turn closed it (harmony's <|call|>)
        template, marker = setup.template, setup.turn_marker
        memo = self.renders.find(turn)
        try:
            text = render_turn(template, msgs, tools, print_, memo.rendered if memo else None)
            plan = None
            if text.after is not None and turn is not None and memo is not None:
                end, chain = text.after.prompt, (memo.kept, memo.ids)
                plan = continue_after(turn, text.tail, end, print_, turn_end, chain)
                if plan is None:  # the history renders otherwise: walk it whole
                    text = render_turn(template, msgs, tools, print_)
            if plan is None:
                whole = text.whole
                assert whole is not None  # rendered whole unless it went on from the parent
                if parent is not None and turn is None:  # made on another path
                    plan = fresh(whole, "parent_without_ids")
                else:
                    mark = marker[0] if marker is not None else ""
                    plan = continue_from(turn, whole, print_, turn_end, mark)
                    if plan.divergence == "fingerprint" and turn is not None:
                        log_change(turn.fingerprint, print_)
        except TemplateFailed as exc:
            raise named(exc, items, instructions, new_items, opts) from None
        sampling = sampling_of(settings, extra, setup.model)
        prompt = TokenPrompt(
            setup.engine,
            plan,
            sampling,
            marker,
            setup.context_window,
            setup.vocab_size,
            text.rendered,
            turn,
        )
        return prompt, print_

    def _setup(self) -> TokenSetup:
        if self.setup is None:
            raise ClientError(
                f"the token path is not ready: {self.not_ready}",
                status=503,
                code="upstream_not_ready",
                type="server_error",
            )
        return self.setup


__all__ = ["ROOT", "TokenDialect", "TokenPrompt", "TokenSetup", "TokenStream", "fingerprint"]
