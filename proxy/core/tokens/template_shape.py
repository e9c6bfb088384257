"""Which chat templates render a conversation one message at a time (docs/tokens.md
"Rendering only the new messages"); proxy/core/tokens/incremental.py uses the answer.

A chat template is a program over the whole message list, so in general the text of a
conversation can only be had by rendering all of it: a template may look at the last
message from the first (Qwen3 drops the reasoning of assistant turns before the last user
message), count the messages, or carry state from one message to the next in a `namespace`.
Such a template rewrites the history when a message is added, and a continuation must render
it whole to find out what changed.

Most templates are simpler: a start that depends on the first message and the tools (the
system prompt, the tool list), then each message rendered on its own, then the generation
prompt. `append_only` reads the template's syntax tree and accepts it only when it has that
shape:

- one top-level `{% for %}` over `messages` itself (no filter, not recursive);
- `messages` read elsewhere only as `messages[0]` or as a truth value (`if messages`), and
  never assigned;
- inside that loop (and in macros, which it may call): of the loop's own variables only
  `loop.first`; no assignment to a namespace attribute (state carried between messages); no
  `strftime_now` (the date would be the history's, not today's);
- `add_generation_prompt` read only after the loop, where there is nothing but
  `{% if add_generation_prompt %}` blocks (and assignments): so without the generation prompt
  nothing follows the last message;
- no `include`, `import`, `extends` or `block`.
"""

from __future__ import annotations

from typing import Final

from jinja2 import nodes

_LOOP_ATTRIBUTES: Final = frozenset({"first"})
_REFUSED_NODES: Final = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends, nodes.Block)


def append_only(tree: nodes.Template) -> str | None:
    """None when the template renders a conversation as a start, each message on its own and
    the generation prompt (the module's rules); else why not, for the log."""
    loops = [
        i for i, n in enumerate(tree.body) if isinstance(n, nodes.For) and _is_messages(n.iter)
    ]
    if len(loops) != 1:
        return "it does not render the messages in one top-level loop"
    at = loops[0]
    main = tree.body[at]
    assert isinstance(main, nodes.For)
    if main.test is not None or main.recursive:
        return "its loop over the messages filters them or is recursive"
    for refused in tree.find_all(_REFUSED_NODES):
        return f"it uses {type(refused).__name__.lower()}"
    for name in tree.find_all(nodes.Name):
        if name.name == "messages" and name.ctx != "load":
            return "it assigns messages"
    why = _check_messages(tree, main)
    if why is not None:
        return why
    for region in tree.body[:at]:
        if (why := _uses_generation_prompt(region)) is not None:
            return why
    for child in [main.target, *main.body, *main.else_]:
        if why := _uses_generation_prompt(child) or _loop_rules(child, own_loop=True):
            return why
    for macro in tree.find_all(nodes.Macro):
        for child in macro.body:
            if why := _uses_generation_prompt(child) or _loop_rules(child, own_loop=False):
                return why
    for after in tree.body[at + 1 :]:
        if _generation_prompt_block(after) or isinstance(after, nodes.Assign | nodes.Macro):
            continue
        return "it writes more than the generation prompt after the messages"
    return None


def _generation_prompt_block(node: nodes.Node) -> bool:
    """`{% if add_generation_prompt %}...{% endif %}`, with no other branch."""
    if not isinstance(node, nodes.If) or node.elif_ or node.else_:
        return False
    return _is_name(node.test, "add_generation_prompt")


def _is_messages(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) and node.name == "messages"


def _check_messages(tree: nodes.Template, main: nodes.For) -> str | None:
    """`messages` is read only as the loop's list, `messages[0]` or a truth value."""
    allowed: set[int] = {id(main.iter)}
    for item in tree.find_all(nodes.Getitem):
        first = isinstance(item.arg, nodes.Const) and item.arg.value == 0
        if first and _is_messages(item.node):
            allowed.add(id(item.node))
    for cond in tree.find_all(nodes.If):
        _truth_values(cond.test, allowed)
    for expr in tree.find_all(nodes.CondExpr):
        _truth_values(expr.test, allowed)
    for name in tree.find_all(nodes.Name):
        if name.name == "messages" and id(name) not in allowed:
            return "it reads the messages otherwise than one by one, messages[0] or `if messages`"
    return None


def _truth_values(node: nodes.Node, allowed: set[int]) -> None:
    if _is_messages(node):
        allowed.add(id(node))
    elif isinstance(node, nodes.And | nodes.Or):
        _truth_values(node.left, allowed)
        _truth_values(node.right, allowed)
    elif isinstance(node, nodes.Not):
        _truth_values(node.node, allowed)


def _uses_generation_prompt(node: nodes.Node) -> str | None:
    for name in node.find_all(nodes.Name):
        if name.name == "add_generation_prompt":
            return "it reads add_generation_prompt before or while rendering the messages"
    return None


def _loop_rules(node: nodes.Node, *, own_loop: bool) -> str | None:
    """What each message's rendering may not do: carry state to the next message, read the
    loop's position other than `loop.first` (`own_loop`: `loop` is the main loop's here),
    or print the date."""
    if isinstance(node, nodes.Assign | nodes.AssignBlock) and isinstance(node.target, nodes.NSRef):
        return "it carries state from one message to the next (a namespace)"
    if isinstance(node, nodes.Call) and _is_name(node.node, "strftime_now"):
        return "it prints the date while rendering the messages"
    if own_loop and isinstance(node, nodes.Getattr) and _is_name(node.node, "loop"):
        if node.attr in _LOOP_ATTRIBUTES:
            return None
        return f"it reads loop.{node.attr} of the loop over the messages"
    if own_loop and _is_name(node, "loop"):
        return "it reads the loop over the messages other than loop.first"
    if isinstance(node, nodes.For):  # an inner loop: `loop` is its own in its body
        for child in (node.target, node.iter, *([node.test] if node.test else [])):
            if (why := _loop_rules(child, own_loop=own_loop)) is not None:
                return why
        for child in [*node.body, *node.else_]:
            if (why := _loop_rules(child, own_loop=False)) is not None:
                return why
        return None
    for child in node.iter_child_nodes():
        if (why := _loop_rules(child, own_loop=own_loop)) is not None:
            return why
    return None


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.name == name


__all__ = ["append_only"]
