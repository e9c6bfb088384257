"""`tag_prefix_len`, which the tool-call parsers run on every piece of streamed text to hold
back what may be the start of a tag, against the plain definition it must keep."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from wsmode.core.tokens.parsers import tag_prefix_len


def _by_definition(text: str, tags: tuple[str, ...]) -> int:
    """The longest suffix of `text`, shorter than the longest tag, that a tag starts with."""
    longest = max((len(tag) for tag in tags), default=1) - 1
    for n in range(min(longest, len(text)), 0, -1):
        if any(tag.startswith(text[-n:]) for tag in tags):
            return n
    return 0


_CHARS = st.text(alphabet="<>[]/_tolc", max_size=24)


@given(_CHARS, st.lists(st.text(alphabet="<>[]/_tolc", max_size=8), max_size=4))
def test_it_is_the_longest_suffix_a_tag_starts_with(text: str, tags: list[str]) -> None:
    assert tag_prefix_len(text, tuple(tags)) == _by_definition(text, tuple(tags))


def test_real_tags() -> None:
    tags = ("<tool_call>", "<think>")
    assert tag_prefix_len("some text <tool_", tags) == len("<tool_")
    assert tag_prefix_len("a < b and <th", tags) == len("<th")
    assert tag_prefix_len("a < b", tags) == 0  # "< b" starts no tag
    assert tag_prefix_len("x<", tags) == 1
    assert tag_prefix_len("plain", tags) == 0
    assert tag_prefix_len("", tags) == 0
    # a whole tag shorter than the longest is held back too, as a prefix of itself
    assert tag_prefix_len("see <think>", tags) == len("<think>")
