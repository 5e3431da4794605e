"""The packaged default tokenizer: offline load, exact round-trip, ChatML template, stable ids, deterministic build."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactrl.tokenizer import (
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    VOCAB_SIZE,
    default_tokenizer_path,
    load_tokenizer,
)

ROOT = Path(__file__).resolve().parents[1]
TOK = load_tokenizer()
# Any unicode text except lone surrogates (not encodable as UTF-8, so not valid model text).
UNICODE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)


@pytest.mark.timeout(30)
def test_loads_offline_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the tokenizer tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = load_tokenizer()
    assert len(tok) == VOCAB_SIZE
    assert tok.encode("def f(x):\n    return x", add_special_tokens=False)


@pytest.mark.timeout(30)
def test_special_ids_are_fixed():
    assert len(TOK) == VOCAB_SIZE
    assert TOK.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        ENDOFTEXT_ID,
        IM_START_ID,
        IM_END_ID,
    ]
    assert TOK.eos_token_id == ENDOFTEXT_ID and TOK.pad_token_id == ENDOFTEXT_ID
    # specials are single ids in text that contains them (they delimit chat turns)
    assert TOK.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)[0] == IM_START_ID
    # and encoding adds nothing on its own (no BOS): the chat template places every special
    assert TOK.encode("hi") == TOK.encode("hi", add_special_tokens=False)


@pytest.mark.timeout(60)
@given(UNICODE)
def test_round_trip_of_any_unicode(text):
    ids = TOK.encode(text, add_special_tokens=False)
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert TOK.decode(ids) == text
    # with specials left as text (how the context wrapper tokenises content) the round trip also holds
    plain = TOK.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert TOK.decode(plain) == text
    assert not {ENDOFTEXT_ID, IM_START_ID, IM_END_ID} & set(plain)


@pytest.mark.timeout(60)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), UNICODE), min_size=1, max_size=5), st.booleans())
def test_chat_template_is_chatml(turns, add_generation_prompt):
    messages = [{"role": r, "content": c} for r, c in turns]
    text = TOK.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    expected = "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns)
    if add_generation_prompt:
        expected += "<|im_start|>assistant\n"
    assert text == expected


@pytest.mark.timeout(30)
def test_chat_template_rejects_unknown_roles():
    with pytest.raises(Exception, match="unknown chat role"):
        TOK.apply_chat_template([{"role": "narrator", "content": "x"}], tokenize=False)


@pytest.mark.timeout(30)
def test_tokenizer_is_compact_on_project_text():
    code = "def compute_total(price, count):\n    return price * count\n"
    ids = TOK.encode(code, add_special_tokens=False)
    assert len(ids) < len(code.encode()) / 2.5  # a trained BPE, not bytes
    tool = "<tool>view app/config.py 1 40</tool>"
    assert len(TOK.encode(tool, add_special_tokens=False)) <= 16


def _load_build_script():
    spec = importlib.util.spec_from_file_location("build_tokenizer", ROOT / "scripts" / "build_tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_tokenizer"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_build_is_deterministic(tmp_path):
    build = _load_build_script()
    a = build.build(tmp_path / "a")
    b = build.build(tmp_path / "b")
    assert [p.name for p in a] == [p.name for p in b]
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes(), f"{pa.name} differs between two builds"
    # the packaged files are the source of truth (models are tied to their ids): a rebuild on a changed
    # corpus may differ from them, but must keep the vocabulary size, the specials and the template
    packaged = default_tokenizer_path()
    assert (tmp_path / "a" / "chat_template.jinja").read_text() == (packaged / "chat_template.jinja").read_text()
    rebuilt = load_tokenizer(tmp_path / "a")
    assert len(rebuilt) == VOCAB_SIZE and rebuilt.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]


# -- one token spec, one shared instance -------------------------------------------------------------


def test_shared_tokenizer_is_one_instance_and_load_gives_a_private_copy():
    from compactrl.tokenizer import shared_tokenizer

    assert shared_tokenizer() is shared_tokenizer()
    private = load_tokenizer()
    assert private is not shared_tokenizer() and private.get_vocab() == shared_tokenizer().get_vocab()


def test_registered_envs_share_the_tokenizer_and_its_chat_format():
    import gymnasium as gym

    import compactrl  # noqa: F401  (registers the ids)
    from compactrl.tokenizer import shared_tokenizer

    a, b = gym.make("CompactCode-v0"), gym.make("CompactTerminal-v0", budget=4096)
    assert a.get_wrapper_attr("tokenizer") is shared_tokenizer() is b.get_wrapper_attr("tokenizer")
    assert a.get_wrapper_attr("fmt") is b.get_wrapper_attr("fmt")


def test_token_spec_is_derived_from_the_chat_template():
    from compactrl.tokenizer import shared_tokenizer
    from compactrl.wrappers.chat_format import chat_format

    fmt = chat_format(shared_tokenizer())
    assert fmt is chat_format(shared_tokenizer()) and fmt is not chat_format(shared_tokenizer(), tool_role="user")
    assert fmt.end_of_turn == IM_END_ID and fmt.stop_ids == {IM_END_ID, ENDOFTEXT_ID}
    assert fmt.pad_id == ENDOFTEXT_ID and {ENDOFTEXT_ID, IM_START_ID, IM_END_ID} <= fmt.special_ids
    # a tokenizer whose template ends turns differently gets its own spec, not a stale cached one
    tok = load_tokenizer()
    assert chat_format(tok).end_of_turn == IM_END_ID
    tok.chat_template = tok.chat_template.replace("<|im_end|>", "<|endoftext|>")
    assert chat_format(tok).end_of_turn == ENDOFTEXT_ID


def test_stop_ids_add_the_model_eos_and_need_some_end_of_turn():
    from types import SimpleNamespace

    from compactrl.wrappers.chat_format import stop_ids

    assert stop_ids(TOK) == [ENDOFTEXT_ID, IM_END_ID]
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, IM_END_ID]))
    assert stop_ids(TOK, model) == sorted({ENDOFTEXT_ID, IM_END_ID, 7})
    bare = SimpleNamespace(chat_template=None, eos_token_id=None)
    with pytest.raises(ValueError, match="end-of-turn"):
        stop_ids(bare)
    assert stop_ids(bare, model) == sorted({IM_END_ID, 7})


@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=200))
def test_valid_unicode_replaces_only_lone_surrogates(text):
    from compactrl.wrappers.chat_format import chat_format, valid_unicode

    clean = valid_unicode(text)
    clean.encode("utf-8")  # never raises
    if not any("\ud800" <= c <= "\udfff" for c in text):
        assert clean is text
    assert len(clean) <= len(text) and clean.count("\ufffd") >= text.count("\ufffd")
    fmt = chat_format(TOK)
    assert fmt.encode(text) == fmt.encode(clean) and fmt.decode(fmt.encode(text)) == clean
