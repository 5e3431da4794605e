"""SWE-bench rows (JSON or JSONL, the official field names) -> :class:`~compactrl.envs.task.Task`.

A row holds ``instance_id``, ``repo`` (``owner/name``), ``base_commit``, ``patch`` (the gold fix),
``test_patch``, ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (JSON-encoded lists in
the official files, plain lists accepted), and optionally ``version``, ``environment_setup_commit``,
``hints_text``, ``created_at``. The repository comes from one of:

* a local checkout (``repos_root/<owner>__<name>``, or ``repo_paths[repo]``): the files at
  ``base_commit`` (``git archive``) become ``Task.files``, and the post-``test_patch`` contents of
  the test files become ``Check.hidden_files``, written only for grading;
* the SWE-bench Docker image (``use_images=True``): ``{namespace}/sweb.eval.{arch}.{instance_id}:{tag}``
  with ``__`` spelled ``_1776_`` (the harness's ``instance_image_key``); the repository lives in
  the image at ``/testbed`` (``metadata["workdir"]``), and grading applies the hidden test patch
  with ``git apply``, runs the tests, then restores the test files.

The test command runs the files ``test_patch`` touches (SWE-bench's test directives: every
``diff --git`` target except non-test extensions) with pytest's ``-rA`` report; success means
every FAIL_TO_PASS and PASS_TO_PASS test passes. Repositories whose harness does not use pytest
(django's ``runtests.py``, sympy's ``bin/test``) need ``test_command`` and are out of scope of the
``-rA`` verdict (docs/task_formats.md).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compactrl.envs.task import Check, Task

log = logging.getLogger(__name__)

NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
"""As ``swebench.harness.constants.NON_TEST_EXTS`` (``csv`` without its dot, as upstream)."""
IMAGE_PYTHON = "/opt/miniconda3/envs/testbed/bin/python"
"""The interpreter of the ``testbed`` conda env in SWE-bench's instance images."""
TEST_PATCH_FILE = ".compactrl_test.patch"
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch")


class SWEBenchError(ValueError):
    """A row that cannot become a task (missing field, unknown repository, bad commit...)."""


@dataclass(frozen=True)
class SWEBenchConfig:
    """How rows become tasks (validated on construction)."""

    repos_root: str | None = None
    """Directory holding one git checkout per repository, named ``<owner>__<name>``."""
    repo_paths: Mapping[str, str] = field(default_factory=dict)
    """``owner/name`` -> checkout path; wins over ``repos_root``."""
    use_images: bool = False
    """Use the SWE-bench instance images instead of local checkouts (files stay in the image)."""
    image_namespace: str | None = "swebench"
    """Registry namespace of the images (None: the local build names, ``sweb.eval.<arch>.<id>``)."""
    image_tag: str = "latest"
    """Tag of the instance images."""
    arch: str = "x86_64"
    """Architecture in the image name (``x86_64`` or ``arm64``)."""
    python: str | None = None
    """Interpreter that runs pytest (default: ``python``; with images, the ``testbed`` env's)."""
    test_command: str | None = None
    """Template of the test command with ``{python}`` and ``{test_files}`` (default: pytest ``-rA``)."""
    setup: tuple[str, ...] = ()
    """Shell commands run in the sandbox before the agent starts (e.g. ``pip install -e .``)."""
    setup_by_repo: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Extra setup commands per ``owner/name``, run after ``setup``."""
    max_file_bytes: int = 2_000_000
    """Files larger than this are left out of ``Task.files`` (counted in ``metadata``)."""
    max_turns: int = 100
    """Turn limit of each task."""
    time_limit_s: float = 3600.0
    """Wall-clock limit of an episode."""
    test_timeout_s: float = 900.0
    """Limit of one test run."""

    def __post_init__(self) -> None:
        if not self.use_images and self.repos_root is None and not self.repo_paths:
            raise ValueError("SWEBenchConfig: expected repos_root or repo_paths (local checkouts), or use_images=True")
        if self.arch not in ("x86_64", "arm64"):
            raise ValueError(f"SWEBenchConfig.arch: expected 'x86_64' or 'arm64', got {self.arch!r}")
        for name in ("max_file_bytes", "max_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"SWEBenchConfig.{name}: expected >= 1, got {getattr(self, name)!r}")
        for name in ("time_limit_s", "test_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SWEBenchConfig.{name}: expected > 0, got {getattr(self, name)!r}")
        if self.test_command is not None and "{test_files}" not in self.test_command:
            raise ValueError(f"SWEBenchConfig.test_command: expected a template with {{test_files}}, got {self.test_command!r}")


def image_name(instance_id: str, namespace: str | None = "swebench", tag: str = "latest", arch: str = "x86_64") -> str:
    """The SWE-bench instance image of ``instance_id`` (as ``TestSpec.instance_image_key``)."""
    key = f"sweb.eval.{arch}.{instance_id.lower()}:{tag}"
    if namespace:
        key = f"{namespace}/{key}".replace("__", "_1776_")
    return key


def patch_targets(diff: str) -> list[str]:
    """Paths a unified git diff writes (``diff --git a/X b/Y`` -> ``Y``), in order, without repeats."""
    out: list[str] = []
    for path in re.findall(r"^diff --git a/.* b/(.*)$", diff, flags=re.MULTILINE):
        if path not in out:
            out.append(path)
    return out


def get_test_directives(test_patch: str) -> list[str]:
    """SWE-bench's test directives for pytest repositories: touched files minus non-test ones."""
    return [p for p in patch_targets(test_patch) if not any(p.endswith(ext) for ext in NON_TEST_EXTS)]


def _test_list(row: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = row.get(key, [])
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SWEBenchError(f"{row.get('instance_id')}: {key} is not a JSON list: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise SWEBenchError(f"{row.get('instance_id')}: {key} must be a list of test ids, got {type(value).__name__}")
    return tuple(value)


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a ``.json`` (a list, or one object) or ``.jsonl`` file."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        rows = json.loads(text)
    elif stripped.startswith("{") and path.endswith(".json"):
        rows = [json.loads(text)]
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(r, dict) for r in rows):
        raise SWEBenchError(f"{path}: expected JSON objects (SWE-bench rows)")
    return rows


# ===================================================================== repository access
def _git(repo: str, *args: str, data: bytes | None = None) -> bytes:
    try:
        res = subprocess.run(["git", "-C", repo, *args], input=data, capture_output=True, timeout=600)
    except FileNotFoundError as exc:
        raise SWEBenchError("git is not installed; local checkouts need it") from exc
    if res.returncode != 0:
        raise SWEBenchError(f"git {' '.join(args[:2])} in {repo} failed: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout


def checkout_path(repo: str, config: SWEBenchConfig) -> str:
    if repo in config.repo_paths:
        path = config.repo_paths[repo]
    elif config.repos_root is not None:
        path = os.path.join(config.repos_root, repo.replace("/", "__"))
    else:
        raise SWEBenchError(f"no checkout for {repo}: set repos_root or repo_paths")
    if not os.path.isdir(path):
        raise SWEBenchError(f"no checkout for {repo} at {path} (expected a git clone named <owner>__<name>)")
    return path


def files_at(repo_path: str, commit: str, max_bytes: int) -> tuple[dict[str, str], list[str]]:
    """Text files of ``commit`` (``git archive``); also the paths left out (binary, too big, links)."""
    data = _git(repo_path, "archive", "--format=tar", commit)
    files, skipped = {}, []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isdir():
                continue
            if not member.isfile() or member.size > max_bytes:
                skipped.append(member.name)
                continue
            raw = tar.extractfile(member).read()  # type: ignore[union-attr]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped.append(member.name)
                continue
            if "\0" in text:
                skipped.append(member.name)
                continue
            files[member.name] = text
    return files, skipped


def apply_patch(files: Mapping[str, str], diff: str) -> dict[str, str | None]:
    """Contents after ``git apply`` of ``diff`` for every path it touches (None: deleted)."""
    targets = patch_targets(diff)
    with tempfile.TemporaryDirectory(prefix="compactrl-patch-") as tmp:
        for path in re.findall(r"^diff --git a/(.*) b/", diff, flags=re.MULTILINE):
            if path in files:
                full = os.path.join(tmp, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8", newline="") as fh:
                    fh.write(files[path])
        res = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tmp, input=diff.encode(),
                             capture_output=True, timeout=120)
        if res.returncode != 0:
            raise SWEBenchError(f"the patch does not apply: {res.stderr.decode(errors='replace').strip()[:500]}")
        out: dict[str, str | None] = {}
        for path in targets:
            full = os.path.join(tmp, path)
            if os.path.isfile(full):
                with open(full, encoding="utf-8", newline="") as fh:
                    out[path] = fh.read()
            else:
                out[path] = None
        return out


# ===================================================================== rows -> tasks
def _instruction(row: Mapping[str, Any]) -> str:
    return (f"{row.get('problem_statement', '').strip()}\n\nResolve the issue above by editing the repository's "
            "source code. Hidden tests check the fix; do not modify the existing tests.")


def _test_command(config: SWEBenchConfig, python: str, tests: list[str]) -> str:
    template = config.test_command or "{python} -m pytest -rA -p no:cacheprovider {test_files}"
    return template.format(python=python, test_files=" ".join(shlex.quote(t) for t in tests))


def row_to_task(row: Mapping[str, Any], config: SWEBenchConfig) -> Task:
    """One SWE-bench row as a Task (see the module docstring); raises :class:`SWEBenchError`."""
    missing = [k for k in REQUIRED if not isinstance(row.get(k), str) or not row.get(k)]
    if missing:
        raise SWEBenchError(f"{row.get('instance_id', '<no instance_id>')}: missing or empty field(s) {missing}")
    iid, repo, base = row["instance_id"], row["repo"], row["base_commit"]
    f2p, p2p = _test_list(row, "FAIL_TO_PASS"), _test_list(row, "PASS_TO_PASS")
    tests = get_test_directives(row["test_patch"])
    if not tests:
        raise SWEBenchError(f"{iid}: test_patch touches no test file")
    setup = tuple(config.setup) + tuple(config.setup_by_repo.get(repo, ()))
    meta: dict[str, Any] = {
        "instance_id": iid, "repo": repo, "base_commit": base, "gold_patch": row["patch"],
        "test_patch": row["test_patch"], "FAIL_TO_PASS": list(f2p), "PASS_TO_PASS": list(p2p),
        "test_files": tests, "version": row.get("version"),
        "environment_setup_commit": row.get("environment_setup_commit"),
    }
    if config.use_images:
        python = config.python or IMAGE_PYTHON
        files: dict[str, str] = {}
        check = Check(kind="pytest", command=_image_check_command(row, config, python, tests), must_pass=f2p + p2p,
                      hidden_files={TEST_PATCH_FILE: row["test_patch"]}, timeout_s=config.test_timeout_s)
        meta["workdir"] = "/testbed"
        image = image_name(iid, config.image_namespace, config.image_tag, config.arch)
    else:
        python = config.python or "python"
        repo_path = checkout_path(repo, config)
        files, skipped = files_at(repo_path, base, config.max_file_bytes)
        patched = apply_patch(files, row["test_patch"])
        deleted = [p for p, c in patched.items() if c is None]
        if deleted:
            log.warning("%s: test_patch deletes %s; deletions are not applied before grading", iid, deleted)
        hidden = {p: c for p, c in patched.items() if c is not None}
        check = Check(kind="pytest", command=_test_command(config, python, tests), must_pass=f2p + p2p,
                      hidden_files=hidden, timeout_s=config.test_timeout_s)
        meta.update(repo_path=os.path.abspath(repo_path), skipped_files=skipped)
        image = None
    return Task(id=iid, kind="code", instruction=_instruction(row), files=files, check=check, setup=setup,
                max_turns=config.max_turns, time_limit_s=config.time_limit_s, docker_image=image,
                source="swebench", metadata=meta)


def _image_check_command(row: Mapping[str, Any], config: SWEBenchConfig, python: str, tests: list[str]) -> str:
    """Reset the test files to ``base_commit``, apply the hidden test patch, run, restore."""
    touched = patch_targets(row["test_patch"])
    new = re.findall(r"^diff --git a/.* b/(.*)\nnew file mode", row["test_patch"], flags=re.MULTILINE)
    modified = [p for p in touched if p not in new]
    q = " ".join(shlex.quote(p) for p in modified)
    n = " ".join(shlex.quote(p) for p in new)
    reset = (f"git checkout -q {row['base_commit']} -- {q} 2>/dev/null; " if modified else "") + (
        f"rm -f {n}; " if new else "")
    return (f"{reset}git apply --whitespace=nowarn {TEST_PATCH_FILE} && {_test_command(config, python, tests)}; "
            f"__rc=$?; {reset}exit $__rc")


def load_swebench(source: str | Iterable[Mapping[str, Any]], config: SWEBenchConfig, *,
                  instance_ids: Iterable[str] | None = None) -> list[Task]:
    """Tasks from a SWE-bench ``.json``/``.jsonl`` file (or rows), optionally only ``instance_ids``."""
    rows = read_rows(source) if isinstance(source, str) else [dict(r) for r in source]
    wanted = set(instance_ids) if instance_ids is not None else None
    tasks = [row_to_task(r, config) for r in rows if wanted is None or r.get("instance_id") in wanted]
    if wanted is not None and len(tasks) != len(wanted):
        found = {t.id for t in tasks}
        raise SWEBenchError(f"instance ids not in {source if isinstance(source, str) else 'the rows'}: "
                            f"{sorted(wanted - found)}")
    return tasks
