"""compactrl's default tokenizer: a 4096-id byte-level BPE with a ChatML chat template.

It ships as package data (``compactrl/data/tokenizer/``, built by ``scripts/build_tokenizer.py``)
and loads offline. It sits at the bottom of the import graph so that wrappers (which count and
keep token ids) and policies (which generate them) share it without importing each other.

Special ids: ``<|endoftext|>`` = 0 (eos and pad), ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 (the
constants below name them for tests and docs; code derives stop and special ids from a tokenizer's
chat template with :func:`compactrl.wrappers.chat_format.chat_format`, so any Hugging Face tokenizer
with a chat template can be used instead wherever a tokenizer is taken).

:func:`shared_tokenizer` is the one instance of the default tokenizer per process (envs, wrappers
and policies read it); :func:`load_tokenizer` returns a fresh object for callers that change settings.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
VOCAB_SIZE = 4096


def default_tokenizer_path() -> Path:
    """The folder holding the packaged tokenizer files."""
    return Path(str(resources.files("compactrl") / "data" / "tokenizer"))


def load_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Load a tokenizer from a local folder (default: the packaged one). Never touches the network.

    Each call returns a fresh object (~15 ms), so callers may change settings such as
    ``padding_side`` without affecting each other; callers that only read use :func:`shared_tokenizer`.
    """
    folder = Path(path) if path is not None else default_tokenizer_path()
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"no tokenizer.json in {folder}; build the default one with `python scripts/build_tokenizer.py`"
        )
    return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)


@functools.cache
def shared_tokenizer() -> PreTrainedTokenizerFast:
    """The default tokenizer, loaded once per process and shared by every env, wrapper and policy.

    Read-only by convention: changing a setting here (``padding_side``, ``chat_template``...) would
    change it for every user in the process. Take a private copy with :func:`load_tokenizer` instead.
    """
    return load_tokenizer()

__all__ = ["VOCAB_SIZE", "default_tokenizer_path", "load_tokenizer", "shared_tokenizer"]
