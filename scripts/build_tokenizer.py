"""Build compactrl's default tokenizer (deterministic): a byte-level BPE with 4096 ids.

Usage::

    python scripts/build_tokenizer.py                 # writes compactrl/data/tokenizer/
    python scripts/build_tokenizer.py --out /tmp/tok  # somewhere else (e.g. to compare two builds)

The corpus is the project's own text: the CompactCode task generator's tasks (instructions and
repository files) when ``compactrl.tasksets.generators.code`` is importable, plus a built-in,
seeded corpus of Python-project text and chat/tool-language turns (``<tool>view PATH 1 40</tool>``,
``<tool>replace ...</tool>``, test reports, summaries). The same code and library versions
produce byte-identical files.

Special tokens (ids fixed): ``<|endoftext|>`` = 0 (eos and pad), ``<|im_start|>`` = 1,
``<|im_end|>`` = 2. The chat template is ChatML:
``<|im_start|>{role}\\n{content}<|im_end|>\\n`` for roles system/user/assistant/tool, and
``<|im_start|>assistant\\n`` as the generation prompt.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ROLES = ("system", "user", "assistant", "tool")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unknown chat role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "compactrl" / "data" / "tokenizer"
GENERATED_TASKS = (("easy", 150), ("default", 40), ("hard", 8))  # train-split tasks per difficulty
BUILTIN_DOCS = 3000

log = logging.getLogger("build_tokenizer")

# ---------------------------------------------------------------------------------------------
# Built-in corpus: Python-project text and the tool language, from a seeded generator.
# ---------------------------------------------------------------------------------------------

_WORDS = (
    "config value cache item user order price total count index name path file line token budget "
    "limit result status error message report parser reader writer buffer record field key table "
    "rate score weight offset size length width height depth level mode flag option default "
    "timeout retry delay batch queue stack node edge graph tree leaf root child parent summary "
    "context trace step reward policy action state episode task test check source target data "
    "input output request response client server handler session account invoice payment tax "
    "discount amount currency unit factor scale threshold minimum maximum average median ratio "
    "product customer inventory warehouse shipment address country region city zone timezone date "
    "time year month day hour minute second interval window span period schedule calendar event "
    "log logger metric counter gauge histogram sample seed random number string list dict tuple "
    "array matrix vector tensor model layer weight bias gradient loss optimizer learning epoch "
    "module package import export version release build deploy server port host url route view "
    "template form widget button label color theme style font image icon asset resource manager "
    "factory builder adapter proxy registry plugin hook callback signal listener observer worker "
    "thread process pool lock mutex semaphore future promise task job runner scheduler executor "
    "temperature pressure volume distance speed velocity mass energy power voltage current charge "
    "student teacher course grade exam lesson library book author title chapter page word letter "
    "player game board move turn round match team league season goal point penalty bonus level"
).split()
_VERBS = (
    "get set load save parse build make compute apply update reset check validate format render "
    "read write open close merge split sort filter map reduce find search replace fetch send "
    "handle process convert normalize clip scale round encode decode register resolve compare "
    "insert delete remove append extend create destroy start stop run execute emit publish "
    "subscribe notify log trace measure estimate predict train evaluate serialize deserialize "
    "compress expand flatten group count sum average collect gather scatter schedule cancel"
).split()
_PROSE = (
    "The test fails because the function returns the wrong value.",
    "I will open the file and look at the implementation first.",
    "The constant is defined in another module; the fix must use it.",
    "Run the tests again after the edit to confirm the fix.",
    "Summary of progress so far: the bug is in the rounding of the total.",
    "Facts found: the discount rate is 15 percent and the currency is EUR.",
    "Please fix the failing test without changing the test file.",
    "Your context is nearly full. Write a summary of everything you still need.",
    "Next step: edit the function so that it reads the limit from the settings module.",
    "All tests passed.",
    "The search found two matches; the second one is the definition.",
)


_SUBJECTS = ("the function", "this test", "the module", "the constant", "the config", "my edit", "the parser", "the value")
_LINKS = ("returns", "reads", "uses", "changes", "depends on", "should equal", "is defined in", "was moved to", "breaks")


def _sentence(rng: random.Random) -> str:
    """One English sentence about the code (reasoning, summaries)."""
    subj, link = rng.choice(_SUBJECTS), rng.choice(_LINKS)
    obj = rng.choice([f"`{_ident(rng, 2)}`", f"{rng.choice(_WORDS)} {rng.choice(_WORDS)}", str(rng.randint(0, 9999)),
                      f"{rng.choice(_WORDS).upper()}_{rng.choice(_WORDS).upper()}"])
    tail = rng.choice(["", f" in {rng.choice(_WORDS)}.py", f" when the {rng.choice(_WORDS)} is {rng.choice(['empty', 'zero', 'negative', 'None', 'large'])}",
                       f", so I need to {rng.choice(_VERBS)} the {rng.choice(_WORDS)}"])
    return f"{subj.capitalize()} {link} {obj}{tail}."


def _summary(rng: random.Random, path: str) -> str:
    facts = [f"- {rng.choice(_WORDS).upper()}_{rng.choice(_WORDS).upper()} = {rng.randint(0, 999)} ({rng.choice(_WORDS)}/{rng.choice(_WORDS)}.py)" for _ in range(rng.randint(1, 4))]
    return "\n".join([f"Summary: working on {path}.", "Facts:", *facts, "Next: " + _sentence(rng)])


def _ident(rng: random.Random, parts: int = 2) -> str:
    words = [rng.choice(_VERBS)] + [rng.choice(_WORDS) for _ in range(parts - 1)]
    return "_".join(words)


def _expr(rng: random.Random, names: list[str]) -> str:
    a, b = rng.choice(names), rng.choice(names + [str(rng.randint(0, 1000)), f"{rng.random():.2f}"])
    return f"{a} {rng.choice(['+', '-', '*', '/', '//', '%'])} {b}"


def _function(rng: random.Random) -> str:
    name = _ident(rng, rng.randint(1, 3))
    args = sorted({rng.choice(_WORDS) for _ in range(rng.randint(1, 3))})
    lines = [f"def {name}({', '.join(args)}):", f'    """{rng.choice(_VERBS).capitalize()} the {rng.choice(_WORDS)}."""']
    local = list(args)
    for _ in range(rng.randint(1, 5)):
        var = rng.choice(_WORDS)
        kind = rng.random()
        if kind < 0.5:
            lines.append(f"    {var} = {_expr(rng, local)}")
        elif kind < 0.7:
            lines.append(f"    if {rng.choice(local)} > {rng.randint(0, 100)}:")
            lines.append(f"        {var} = {rng.choice(local)}")
        elif kind < 0.85:
            lines.append(f"    for item in {rng.choice(local)}:")
            lines.append(f"        {var} = {rng.choice(_VERBS)}_{rng.choice(_WORDS)}(item)")
        else:
            lines.append(f"    {var} = {{'{rng.choice(_WORDS)}': {rng.randint(0, 99)}, '{rng.choice(_WORDS)}': None}}")
        local.append(var)
    lines.append(f"    return {rng.choice(local)}")
    return "\n".join(lines) + "\n"


def _module(rng: random.Random) -> tuple[str, str]:
    pkg = rng.choice(["app", "shop", "billing", "core", "utils", "service", "lib"])
    path = f"{pkg}/{rng.choice(_WORDS)}.py"
    head = [f'"""{rng.choice(_WORDS).capitalize()} helpers."""', ""]
    if rng.random() < 0.6:
        head.append(f"from {pkg}.{rng.choice(_WORDS)} import {rng.choice(_WORDS).upper()}_{rng.choice(_WORDS).upper()}")
    if rng.random() < 0.5:
        head.append("import math")
    head.append("")
    consts = [f"{rng.choice(_WORDS).upper()}_{rng.choice(_WORDS).upper()} = {rng.randint(1, 500)}" for _ in range(rng.randint(0, 3))]
    body = [_function(rng) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.3:
        cls = "".join(w.capitalize() for w in (rng.choice(_WORDS), rng.choice(_WORDS)))
        body.append(f"class {cls}:\n    def __init__(self, {rng.choice(_WORDS)}):\n        self.value = 0\n")
    return path, "\n".join(head + consts + [""] + body)


def _test_module(rng: random.Random) -> tuple[str, str]:
    mod = rng.choice(_WORDS)
    names = [_ident(rng, 2) for _ in range(rng.randint(1, 4))]
    lines = [f"from app.{mod} import {', '.join(names)}", ""]
    for n in names:
        lines += [f"def test_{n}():", f"    assert {n}({rng.randint(0, 50)}) == {rng.randint(0, 500)}", ""]
    return f"tests/test_{mod}.py", "\n".join(lines)


def _tool_turns(rng: random.Random, path: str, text: str) -> Iterator[tuple[str, str]]:
    lines = text.splitlines()
    a = rng.randint(1, max(1, len(lines)))
    b = min(len(lines), a + rng.randint(5, 40))
    yield "assistant", f"<tool>view {path} {a} {b}</tool>"
    yield "tool", "\n".join(f"{i:4d} | {ln}" for i, ln in enumerate(lines[a - 1 : b], start=a))
    word = rng.choice(_WORDS)
    yield "assistant", f"<tool>search {word}</tool>"
    yield "tool", "\n".join(f"{path}:{rng.randint(1, 90)}: {rng.choice(lines) if lines else word}" for _ in range(rng.randint(0, 4))) or "no matches"
    if lines:
        old = rng.choice(lines)
        new = old.replace(" + ", " - ") if " + " in old else old + "  # fixed"
        yield "assistant", f"<tool>replace {path}\n<old>\n{old}\n</old>\n<new>\n{new}\n</new>\n</tool>"
        yield "tool", rng.choice(["replaced 1 occurrence", "error: <old> text not found in " + path])
    yield "assistant", "<tool>test</tool>"
    n_fail = rng.randint(0, 3)
    report = [f"FAILED tests/test_{rng.choice(_WORDS)}.py::test_{_ident(rng)} - AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}" for _ in range(n_fail)]
    report.append(f"{n_fail} failed, {rng.randint(1, 20)} passed in 0.{rng.randint(10, 99)}s" if n_fail else f"{rng.randint(1, 20)} passed in 0.{rng.randint(10, 99)}s")
    yield "tool", "\n".join(report)
    if rng.random() < 0.3:
        cmd = rng.choice(["ls -la", "cat setup.cfg", "python -m pytest -x -q", "grep -rn TODO .", "git diff"])
        yield "assistant", f"<tool>shell {cmd}</tool>"
        yield "tool", f"$ {cmd}\nexit code {rng.choice([0, 0, 1, 2])}"
    if rng.random() < 0.5:
        yield "user", rng.choice(_PROSE[7:8])
        yield "assistant", _summary(rng, path)
    yield "assistant", " ".join([rng.choice(_PROSE)] + [_sentence(rng) for _ in range(rng.randint(1, 4))])
    yield "assistant", "<tool>submit</tool>"


def builtin_corpus(seed: int = 0, n_docs: int = BUILTIN_DOCS) -> Iterator[str]:
    """Seeded Python-project and chat/tool-language documents (the tokenizer's fallback corpus)."""
    rng = random.Random(seed)
    for _ in range(n_docs):
        path, text = _module(rng) if rng.random() < 0.75 else _test_module(rng)
        yield text
        turns = [("system", "You are a coding agent. Use one tool per turn."), ("user", rng.choice(_PROSE[6:7]) + f" The bug is in {path}.")]
        turns += list(_tool_turns(rng, path, text))
        yield "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns)


def generated_corpus(seed: int = 0) -> Iterator[str]:
    """Generated CompactCode tasks (train split) as the agent meets them, when the generator exists.

    Per task: the raw files, and a ChatML conversation with the tool descriptions, the instruction
    and ``view`` outputs in the env's line-numbered format.
    """
    try:
        from compactrl.tasksets.generators.code import CodeTaskGenerator, task_seed_for
        from compactrl.tools import TOOL_NAMES, describe_tools
    except ImportError:
        log.warning("compactrl.tasksets.generators.code not importable: using the built-in corpus only")
        return
    rng = random.Random(seed)
    system = describe_tools(TOOL_NAMES)
    for difficulty, count in GENERATED_TASKS:
        gen = CodeTaskGenerator(difficulty)
        for i in range(count):
            task = gen.generate(task_seed_for("train", i))
            listing = "\n".join(f"{p} ({len(t.splitlines())} lines)" for p, t in sorted(task.files.items()))
            turns = [("system", system), ("user", f"{task.instruction}\n\nFiles in the work dir:\n{listing}")]
            for path in sorted(task.files):
                text = task.files[path]
                yield text
                lines = text.splitlines() or [""]
                a = rng.randint(1, len(lines))
                b = min(len(lines), a + rng.randint(10, 60))
                body = "\n".join(f"{j:>4}\t{lines[j - 1]}" for j in range(a, b + 1))
                turns += [("assistant", f"<tool>view {path} {a} {b}</tool>"),
                          ("tool", f"{path} (lines {a}-{b} of {len(lines)})\n{body}")]
            yield "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns)


# ---------------------------------------------------------------------------------------------
# Training and saving
# ---------------------------------------------------------------------------------------------


def train(texts: list[str]):
    """Train the byte-level BPE and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained vocabulary has {tok.get_vocab_size()} ids, expected {VOCAB_SIZE}: grow the corpus")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=SPECIAL_TOKENS[0],
        pad_token=SPECIAL_TOKENS[0],
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def build(out: Path, seed: int = 0) -> list[Path]:
    """Train on the corpus and write the tokenizer files to ``out`` atomically (temp dir, rename)."""
    texts = list(generated_corpus(seed)) + list(builtin_corpus(seed))
    hf = train(texts)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=out.parent))
    hf.save_pretrained(str(tmp))
    if out.exists():
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    os.replace(tmp, out)
    return sorted(out.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the built-in corpus (default: 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(message)s")
    for f in build(args.out, args.seed):
        log.info("wrote %s (%d bytes)", f, f.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
