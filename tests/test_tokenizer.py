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
