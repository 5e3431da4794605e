"""A gateway in front of a tiny real model, on a free loopback port, shared by a module's tests."""

import pytest

from compactrl.gateway import Gateway, GatewayConfig, LocalEngine
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.server import ServeConfig
from compactrl.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def policy():
    return TransformersPolicy(tiny_moe("glm4_moe", seed=0), load_tokenizer(), seed=0)


@pytest.fixture(scope="module")
def gateway(policy, tmp_path_factory):
    config = GatewayConfig(serve=ServeConfig(port=0, model_name="tiny", batch_wait_ms=10, max_body_bytes=200_000),
                           record_dir=str(tmp_path_factory.mktemp("sessions")), max_n=4, default_max_tokens=24)
    with Gateway(LocalEngine(policy, batch_wait_ms=10, threads=1), config) as gw:
        yield gw
