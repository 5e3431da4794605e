"""compactrl's default tokenizer: a 4096-id byte-level BPE with a ChatML chat template.

It ships as package data (``compactrl/data/tokenizer/``, built by ``scripts/build_tokenizer.py``)
and loads offline. It sits at the bottom of the import graph so that wrappers (which count and
keep token ids) and policies (which generate them) share it without importing each other.

Special ids: ``<|endoftext|>`` = 0 (eos and pad), ``<|im_start|>`` = 1, ``<|im_end|>`` = 2.
Any Hugging Face tokenizer with a chat template can be used instead wherever a tokenizer is taken.
"""

from __future__ import annotations

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
    ``padding_side`` without affecting each other.
    """
    folder = Path(path) if path is not None else default_tokenizer_path()
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"no tokenizer.json in {folder}; build the default one with `python scripts/build_tokenizer.py`"
        )
    return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
