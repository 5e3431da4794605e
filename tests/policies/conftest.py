import pytest

from compactrl.policies.tiny_moe import ARCHS
from compactrl.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param
