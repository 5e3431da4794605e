"""UnicodeText and the tool-language parser."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactrl.envs.spaces import ChatMessages, UnicodeText
from compactrl.tools import FormatError, ToolCall, format_call, normalize_path, parse_action

pytestmark = pytest.mark.timeout(60)


@given(st.text(max_size=300))
def test_unicode_text_contains_any_string_within_length(text):
    space = UnicodeText(300)
    assert space.contains(text)
    assert not UnicodeText(len(text) - 1).contains(text) if text else True


def test_unicode_text_sample_is_contained_and_seeded():
    space = UnicodeText(10_000_000, seed=3)
    samples = [space.sample() for _ in range(20)]
    assert all(space.contains(s) for s in samples)
    assert max(len(s) for s in samples) <= space.sample_max_length
    again = UnicodeText(10_000_000, seed=3)
    assert [again.sample() for _ in range(20)] == samples
    assert not space.contains(b"bytes") and not space.contains(None)
    assert UnicodeText(5) == UnicodeText(5) and UnicodeText(5) != UnicodeText(6)


MESSAGE_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=50)


@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]),
                                       "content": MESSAGE_TEXT}), max_size=6))
def test_chat_messages_contains_any_tuple_of_messages_within_length(messages):
    space = ChatMessages(50)
    assert space.contains(tuple(messages))
    assert not space.contains(list(messages)) or not messages  # a list is not a context
    if messages:
        assert not space.contains(({**messages[0], "name": "x"},))  # exactly the two keys
        assert not space.contains(({"role": "user", "content": "x" * 51},))
        assert not space.contains(({"role": "r" * 17, "content": ""},))


def test_chat_messages_sample_is_contained_seeded_and_validated():
    a, b = ChatMessages(300, seed=4), ChatMessages(300, seed=4)
    samples = [a.sample() for _ in range(20)]
    assert samples == [b.sample() for _ in range(20)] and all(a.contains(s) for s in samples)
    assert all([m["role"] for m in s[:2]] == ["system", "user"] for s in samples)
    assert a == b and hash(a) == hash(b) and a != ChatMessages(301) and not a.is_np_flattenable
    with pytest.raises(ValueError, match="max_content_length"):
        ChatMessages(0)


@given(st.text())
def test_parse_never_raises(text):
    result = parse_action(text)
    assert isinstance(result, (ToolCall, FormatError))


_path = st.from_regex(r"\A[a-z][a-z0-9_./-]{0,20}\Z", fullmatch=True).filter(lambda p: "<" not in p)
_payload = st.text().filter(lambda t: all(m not in t for m in ("<tool>", "</tool>", "<old>", "</old>", "<new>", "</new>", "<content>", "</content>")))
_calls = st.one_of(
    st.builds(lambda p: ToolCall("view", path=p), _path),
    st.builds(lambda p, a, n: ToolCall("view", path=p, start=a, end=a + n), _path, st.integers(1, 10**6), st.integers(0, 10**6)),
    st.builds(lambda pat, p: ToolCall("search", pattern=pat, path=p),
              st.text(min_size=1).filter(lambda t: '"' not in t and t.strip() == t and t and "<tool>" not in t and "</tool>" not in t),
              st.one_of(st.none(), _path)),
    st.builds(lambda p, o, n: ToolCall("replace", path=p, old=o, new=n), _path, _payload.filter(bool), _payload),
    st.builds(lambda p, c: ToolCall("create", path=p, content=c), _path, _payload),
    st.sampled_from([ToolCall("test"), ToolCall("submit")]),
    st.builds(lambda c: ToolCall("shell", command=c), st.text(min_size=1).map(str.strip).filter(lambda t: t and "<tool>" not in t and "</tool>" not in t)),
)


@given(_calls, st.text().filter(lambda t: "<tool>" not in t and "</tool>" not in t))
def test_format_then_parse_round_trips(call, reasoning):
    assert parse_action(format_call(call)) == call
    assert parse_action(reasoning + "\n" + format_call(call) + "\n" + reasoning) == call


def test_payload_rule_drops_one_leading_newline_only():
    call = parse_action("<tool>replace a.py\n<old>\nx = 1\n</old>\n<new>\n\ny = 2\n</new>\n</tool>")
    assert call == ToolCall("replace", path="a.py", old="x = 1\n", new="\ny = 2\n")
    assert parse_action("<tool>replace a.py\n<old>x</old><new></new></tool>") == ToolCall("replace", path="a.py", old="x", new="")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("no call here", "no tool call"),
        ("<tool>view a</tool><tool>test</tool>", "exactly one"),
        ("<tool>view a", "not closed"),
        ("<tool>frob a</tool>", "unknown tool"),
        ("<tool></tool>", "unknown tool"),
        ("<tool>view</tool>", "view takes"),
        ("<tool>view a 3 2</tool>", "START <= END"),
        ("<tool>view a x y</tool>", "integers"),
        ("<tool>search</tool>", "non-empty pattern"),
        ('<tool>search "open</tool>', "unterminated"),
        ("<tool>test now</tool>", "no arguments"),
        ("<tool>replace a.py\n<old>\nx\n</old>\n</tool>", "<new>"),
        ("<tool>replace a.py\n<new>\ny\n</new>\n<old>\nx\n</old>\n</tool>", "order"),
        ("<tool>replace a.py\n<old>\n</old>\n<new>\ny\n</new>\n</tool>", "non-empty"),
        ("<tool>create a.py</tool>", "<content>"),
        ("<tool>create\n<content>\nx\n</content>\n</tool>", "one path"),
        ("<tool>shell   </tool>", "needs a command"),
    ],
)
def test_format_errors_explain(text, fragment):
    result = parse_action(text)
    assert isinstance(result, FormatError)
    assert fragment in result.message


def test_search_quoted_pattern_and_path():
    assert parse_action('<tool>search "service fee" docs</tool>') == ToolCall("search", pattern="service fee", path="docs")
    assert parse_action("<tool>search PAGE_SIZE</tool>") == ToolCall("search", pattern="PAGE_SIZE")


def test_normalize_path():
    assert normalize_path("./a//b/./c.py") == "a/b/c.py"
    assert normalize_path(".") == ""
    for bad in ("/etc/passwd", "../x", "a/../../b"):
        with pytest.raises(ValueError):
            normalize_path(bad)
