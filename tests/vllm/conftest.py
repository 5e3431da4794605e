"""Tests of the real vLLM engine process (``.venv-vllm``, built by ``bash scripts/setup.sh --vllm``,
which the README's test command runs). One engine per architecture per test session, started on first
use and closed at the end of the session; every test here is marked ``vllm``."""

from __future__ import annotations

import copy

import pytest

from compactrl.serving.vllm.client import engine_env_missing

MISSING = engine_env_missing()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
            if MISSING:
                item.add_marker(pytest.mark.skip(reason=MISSING))


@pytest.fixture(scope="session")
def tokenizer():
    from compactrl.tokenizer import load_tokenizer

    return load_tokenizer()


class Served:
    """A learner model and the engine serving it (the learner copy is the tests' to change)."""

    def __init__(self, arch: str, tokenizer, directory, **engine) -> None:
        from compactrl.policies.tiny_moe import tiny_moe
        from compactrl.serving.vllm.policy import VLLMPolicy

        kwargs = {"head_dim": 64} if arch in ("glm4_moe", "qwen3_moe", "mixtral") else {}
        self.arch = arch
        self.model = tiny_moe(arch, vocab_size=len(tokenizer), seed=3, **kwargs)
        self.initial = copy.deepcopy(self.model.state_dict())
        self.policy = VLLMPolicy.from_model(self.model, tokenizer, directory, engine=engine, seed=0)


@pytest.fixture(scope="session")
def engines(tokenizer, tmp_path_factory):
    """``engines(arch)``: the session's engine for ``arch`` (started on first use)."""
    started: dict[str, Served] = {}

    def get(arch: str) -> Served:
        if arch not in started:
            started[arch] = Served(arch, tokenizer, tmp_path_factory.mktemp(f"engine-{arch}"))
        return started[arch]

    yield get
    for served in started.values():
        served.policy.close()
        assert served.policy.engine.proc.poll() is not None, f"the {served.arch} engine process is still running"
