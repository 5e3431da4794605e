"""`compactrl eval --policy PATH|URL` end to end on a tiny model: a saved model directory, and the same
model served by a real `compactrl serve` process on 127.0.0.1, play the episodes the in-memory model
plays (greedy, one env: the same computation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compactrl.cli import main
from compactrl.eval import PolicySpec, evaluate, make_policy
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.tokenizer import load_tokenizer

pytestmark = pytest.mark.timeout(300)

ENV_KWARGS = dict(difficulty="tiny", max_turns=3, budget=760, reserve=40, tool_output_cap=96, max_compactions=2)
COMPARED = ("task_id", "task_seed", "num_traces", "compactions", "generated_tokens", "summary_tokens", "trace_tokens",
            "steps", "reward", "success", "info")
ARGS = ["eval", "--episodes", "2", "--seed", "4", "--env-kwargs", json.dumps(ENV_KWARGS), "--json"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A run-style model directory (model + tokenizer) and one holding only the model."""
    tok = load_tokenizer()
    model = tiny_moe("glm4_moe", vocab_size=len(tok), seed=0)
    full, bare = tmp_path_factory.mktemp("final_model"), tmp_path_factory.mktemp("model_only")
    TransformersPolicy(model, tok).save_pretrained(full)
    model.save_pretrained(bare)
    return str(full), str(bare)


@pytest.fixture(scope="module")
def reference(model_dirs):
    """The episodes of the in-memory model, loaded back from the directory, greedy."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # a module fixture runs before the function-scoped one of conftest.py
    model = AutoModelForCausalLM.from_pretrained(model_dirs[0], experts_implementation="grouped_mm").eval()
    policy = TransformersPolicy(model, load_tokenizer(), temperature=0.0, seed=4, max_new_tokens=512)
    _, stats = evaluate("CompactCode-v0", policy, episodes=2, seed=4, env_kwargs=ENV_KWARGS, give_task_to_policy=False)
    return [{k: s.to_dict()[k] for k in COMPARED} for s in stats]


def _episodes(printed: dict) -> list[dict]:
    return [{k: r[k] for k in COMPARED} for r in printed["episodes"]]


def test_saved_model_directory(model_dirs, reference, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    assert main([*ARGS, "--policy", model_dirs[0], "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert _episodes(printed) == reference and sum(r["generated_tokens"] for r in reference) > 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == printed["episodes"]
    assert printed["summary"]["episodes"] == 2 and printed["config"]["policy"] == model_dirs[0]


def test_a_model_directory_without_a_tokenizer_uses_the_project_one(model_dirs):
    assert not os.path.exists(os.path.join(model_dirs[1], "tokenizer.json"))
    policy = make_policy(PolicySpec(name=model_dirs[1]))
    assert policy.tokenizer.get_vocab() == load_tokenizer().get_vocab()
    assert policy.sampling.temperature == 0.0


def test_served_url(model_dirs, reference, capsys):
    proc = subprocess.Popen([sys.executable, "-m", "compactrl.cli", "serve", "--model", model_dirs[0], "--port", "0",
                             "--threads", "1", "--seed", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    try:
        url = _served_url(proc)
        assert url.startswith("http://127.0.0.1:")
        assert main([*ARGS, "--policy", url]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert _episodes(printed) == reference
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _served_url(proc: subprocess.Popen) -> str:
    """The URL the server prints once it listens (readline returns '' if it exits first)."""
    lines = []
    for line in iter(proc.stdout.readline, ""):
        lines.append(line)
        if line.startswith("compactrl serve: model"):
            return line.rsplit(" on ", 1)[1].strip().removesuffix("/v1")
    raise RuntimeError(f"compactrl serve exited with {proc.wait()}: {''.join(lines)}")


def test_an_unreachable_url_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--policy", "http://127.0.0.1:9"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("compactrl eval: error: policy:") and err.count("\n") == 1
