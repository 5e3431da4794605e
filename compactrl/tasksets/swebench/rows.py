"""SWE-bench rows (JSON or JSONL, the official field names) -> :class:`~compactrl.task.Task`.

A row holds ``instance_id``, ``repo`` (``owner/name``), ``base_commit``, ``patch`` (the gold fix),
``test_patch``, ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (JSON-encoded lists in
the official files, plain lists accepted), and optionally ``version``, ``environment_setup_commit``,
``hints_text``, ``created_at``. The repository comes from one of:

* a local checkout (``repos_root/<owner>__<name>``, or ``repo_paths[repo]``): the files at
  ``base_commit`` (``git archive``) become ``Task.files``, and the post-``test_patch`` contents of
  the test files become ``Check.hidden_files``, written only for grading;
* the SWE-bench Docker image (``use_images=True``): ``{namespace}/sweb.eval.{arch}.{instance_id}:{tag}``
  with ``__`` spelled ``_1776_`` (the harness's ``instance_image_key``); the repository lives in
  the image at ``/testbed`` (``Task.runtime.workdir``), and grading applies the hidden test patch
  with ``git apply``, runs the tests, then restores the test files.

The test command runs the files ``test_patch`` touches (SWE-bench's test directives: every
``diff --git`` target except non-test extensions) with pytest's ``-rA`` report, into a log that the
task's check grades inside the sandbox exactly as the harness does (:mod:`.swebench_grading`, the
repository's log parser, written as a hidden file and run by the task's interpreter): resolved iff
every FAIL_TO_PASS test passes and no PASS_TO_PASS test fails; the output ends with the missing and
failing required ids. Per-repository settings (interpreter, setup, test command, log parser, files
an install step generates) come from ``specs`` and from a row's own fields (:func:`row_spec`).
Rows are validated strictly: every error names the file and line, the instance and the field.
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

from compactrl.task import Check, Grading, Reference, Runtime, Task
from compactrl.tasksets.swebench import grading
from compactrl.tasksets.swebench.network import network_reason

log = logging.getLogger(__name__)

NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
"""As ``swebench.harness.constants.NON_TEST_EXTS`` (``csv`` without its dot, as upstream)."""
IMAGE_PYTHON = "/opt/miniconda3/envs/testbed/bin/python"
"""The interpreter of the ``testbed`` conda env in SWE-bench's instance images."""
TEST_PATCH_FILE = ".compactrl_test.patch"
GRADER_FILE = ".compactrl_grade.py"
"""The grading script (:mod:`.swebench_grading`'s source), a hidden file of every SWE-bench task."""
GRADE_SPEC = ".compactrl_grade.json"
GRADE_LOG = ".compactrl_test.log"
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
    """Files larger than this are left out of ``Task.files`` (listed in ``Task.origin["skipped_files"]``)."""
    max_turns: int = 100
    """Turn limit of each task."""
    time_limit_s: float = 3600.0
    """Wall-clock limit of an episode."""
    test_timeout_s: float = 1800.0
    """Limit of one test run: the harness's own default (``run_evaluation --timeout 1800``), so a row
    whose tests are slow but finish there is graded, not timed out (sympy-13437: 865 s here)."""
    specs: Mapping[str, Mapping[str, Any]] | str = field(default_factory=dict)
    """Per-repository settings, or the path of a specs file (:func:`load_specs`; ``compactrl tasks
    prepare`` writes one): ``owner/name``, ``owner/name@version`` or an ``instance_id`` ->
    ``python``, ``setup``, ``test_command``, ``pre_test``, ``log_parser``, ``generated_files``,
    ``checkout`` (the instance's prepared work tree, used instead of ``repos_root``: its files,
    modes and build outputs are what the sandbox gets), ``not_gradable`` (why a row cannot be graded
    faithfully here)."""

    def __post_init__(self) -> None:
        if isinstance(self.specs, str):  # the file `compactrl tasks prepare` wrote (its specs.json)
            try:
                object.__setattr__(self, "specs", load_specs(self.specs))
            except (OSError, ValueError) as exc:
                raise ValueError(f"SWEBenchConfig.specs: {exc}") from None
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
        for key, spec in self.specs.items():
            _validate_spec(f"SWEBenchConfig.specs[{key!r}].", spec)


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


def get_test_directives(test_patch: str, repo: str | None = None) -> list[str]:
    """SWE-bench's test directives: touched files minus non-test ones; for ``django/django``, as
    its ``runtests.py`` takes them, module labels (``tests/a/b.py`` -> ``a.b``)."""
    paths = [p for p in patch_targets(test_patch) if not any(p.endswith(ext) for ext in NON_TEST_EXTS)]
    if repo == "django/django":
        paths = [p.removeprefix("tests/").removesuffix(".py").replace("/", ".") for p in paths]
    return paths


def _test_list(row: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    if key not in row:
        raise SWEBenchError(f"{where}: {key}: missing (a JSON list of test ids)")
    value = row[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SWEBenchError(f"{where}: {key}: not a JSON list: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise SWEBenchError(f"{where}: {key}: must be a list of test ids, got {type(value).__name__}")
    return tuple(value)


def read_located_rows(path: str) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of a ``.json`` (a list, or one object) or ``.jsonl`` file; ``where`` is
    ``path:line`` (the row's first line), so every later error names the row's place."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    stripped = text.lstrip()
    if stripped.startswith("[") or (stripped.startswith("{") and path.endswith(".json")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SWEBenchError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        rows = value if isinstance(value, list) else [value]
        located = [(f"{path}: row {i}", r) for i, r in enumerate(rows)]
    else:
        located = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                located.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise SWEBenchError(f"{path}:{number}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    for where, row in located:
        if not isinstance(row, dict):
            raise SWEBenchError(f"{where}: expected a JSON object (a SWE-bench row), got {type(row).__name__}")
    return located


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a ``.json`` (a list, or one object) or ``.jsonl`` file."""
    return [row for _, row in read_located_rows(path)]


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


def is_commit(repo_path: str, commit: str) -> bool:
    """Whether ``commit`` names a commit of the checkout (``git cat-file -e <commit>^{commit}``)."""
    res = subprocess.run(["git", "-C", repo_path, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, timeout=60)
    return res.returncode == 0


def _text(raw: bytes, size_ok: bool) -> str | None:
    if not size_ok:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def files_at(repo_path: str, commit: str, max_bytes: int) -> tuple[dict[str, str], list[str]]:
    """Text files of ``commit`` (``git archive``); also the paths left out (binary, too big, links)."""
    data = _git(repo_path, "archive", "--format=tar", commit)
    files, skipped = {}, []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isdir():
                continue
            ok = member.isfile() and member.size <= max_bytes
            text = _text(tar.extractfile(member).read(), ok) if ok else None  # type: ignore[union-attr]
            if text is None:
                skipped.append(member.name)
            else:
                files[member.name] = text
    return files, skipped


def tree_files(tree: str, commit: str, max_bytes: int, where: str = "") -> tuple[dict[str, str], list[str]]:
    """Text files of a prepared work tree as they are on disk (after the harness's ``pre_install``
    and install steps, e.g. sphinx's ``tox.ini`` edit), its tracked paths only; also the paths left
    out (binary, too big, links: the sandbox copies those from the tree itself). The tree must be
    checked out at ``commit``."""
    head = _git(tree, "rev-parse", "HEAD").decode().strip()
    if head != _git(tree, "rev-parse", f"{commit}^{{commit}}").decode().strip():
        raise SWEBenchError(f"{where + ': ' if where else ''}checkout: the work tree {tree} is at {head[:12]}, not at "
                            f"base_commit {commit[:12]} (run `compactrl tasks prepare` again)")
    files, skipped = {}, []
    for rel in sorted({p for p in _git(tree, "ls-files", "-z").decode().split("\0") if p}):
        full = os.path.join(tree, rel)
        if os.path.islink(full) or not os.path.isfile(full):
            skipped.append(rel)
            continue
        with open(full, "rb") as fh:
            text = _text(fh.read(), os.path.getsize(full) <= max_bytes)
        if text is None:
            skipped.append(rel)
        else:
            files[rel] = text
    return files, skipped


def generated_files(repo_path: str, commit: str, patterns: Iterable[str], max_bytes: int) -> dict[str, str]:
    """Untracked files of the checkout's work tree matching ``patterns`` (globs such as
    ``astropy/_version.py``): what an install step generated, which ``git archive`` leaves out.
    The work tree must be at ``commit``, or the files could belong to another version."""
    head = _git(repo_path, "rev-parse", "HEAD").decode().strip()
    if head != _git(repo_path, "rev-parse", f"{commit}^{{commit}}").decode().strip():
        raise SWEBenchError(f"the checkout {repo_path} is at {head[:12]}, not at base_commit {commit[:12]}; "
                            "generated files are taken from a work tree checked out (and installed) at base_commit")
    listed = _git(repo_path, "ls-files", "-z", "--others", "--exclude-standard", "--ignored", "--", *patterns)
    listed += _git(repo_path, "ls-files", "-z", "--others", "--exclude-standard", "--", *patterns)
    out: dict[str, str] = {}
    for rel in sorted({p for p in listed.decode().split("\0") if p}):
        full = os.path.join(repo_path, rel)
        with open(full, "rb") as fh:
            text = _text(fh.read(), os.path.getsize(full) <= max_bytes)
        if text is not None:
            out[rel] = text
    return out


def apply_patch(files: Mapping[str, str], diff: str, name: str = "the patch") -> dict[str, str | None]:
    """Contents after ``git apply`` of ``diff`` for every path it touches (None: deleted); ``name``
    (e.g. ``"test_patch"``) names the patch in the error when it does not apply."""
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
            raise SWEBenchError(f"{name} does not apply: {res.stderr.decode(errors='replace').strip()[:500]}")
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


SPEC_KEYS = ("python", "setup", "test_command", "pre_test", "log_parser", "generated_files", "checkout",
             "not_gradable")
"""What a spec (per repository, ``repo@version`` or instance, or a row's own fields) may set."""


def load_specs(path: str) -> dict[str, dict[str, Any]]:
    """A specs file (JSON, or YAML when the name ends ``.yaml``/``.yml``): ``{key: {field: value}}``
    with keys ``owner/name``, ``owner/name@version`` or an ``instance_id``, fields :data:`SPEC_KEYS`."""
    with open(path, encoding="utf-8") as fh:
        if path.endswith((".yaml", ".yml")):
            import yaml

            value = yaml.safe_load(fh)
        else:
            value = json.load(fh)
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{path}: expected a mapping of repository/instance keys to mappings of {list(SPEC_KEYS)}")
    return value


def _validate_spec(prefix: str, spec: Mapping[str, Any]) -> None:
    """ValueError ``{prefix}{field}: ...`` for a bad field (``prefix``: ``"specs['r']."`` or ``"file:3: id: "``)."""
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"{prefix.rstrip('.: ')}: unknown field(s) {unknown}; expected some of {list(SPEC_KEYS)}")
    for key in ("setup", "generated_files", "pre_test"):
        value = spec.get(key, ())
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{prefix}{key}: expected a list of strings, got {value!r}")
    for key in ("python", "test_command", "log_parser", "checkout", "not_gradable"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise ValueError(f"{prefix}{key}: expected a string, got {spec[key]!r}")
    if spec.get("test_command") and "{test_files}" not in spec["test_command"]:
        raise ValueError(f"{prefix}test_command: expected a template with {{test_files}}, got {spec['test_command']!r}")
    if spec.get("log_parser"):
        try:
            grading.parser_name("", spec["log_parser"])
        except ValueError as exc:
            raise ValueError(f"{prefix}{exc}") from None


def row_spec(row: Mapping[str, Any], config: SWEBenchConfig) -> dict[str, Any]:
    """The row's settings: the config's, then ``specs[repo]``, ``specs[repo@version]``,
    ``specs[instance_id]``, then the row's own fields (each later one wins; ``setup`` adds up)."""
    repo = row["repo"]
    merged: dict[str, Any] = {"python": config.python, "test_command": config.test_command, "log_parser": None,
                              "setup": list(config.setup) + list(config.setup_by_repo.get(repo, ())),
                              "generated_files": [], "checkout": None, "pre_test": [], "not_gradable": None}
    own = {k: row[k] for k in SPEC_KEYS if row.get(k) is not None}
    layers = [config.specs.get(repo), config.specs.get(f"{repo}@{row.get('version')}"),
              config.specs.get(row["instance_id"]), own]
    for layer in layers:
        for key, value in (layer or {}).items():
            merged[key] = merged[key] + list(value) if key == "setup" else value
    return merged


def _test_command(template: str | None, python: str, tests: list[str]) -> str:
    template = template or "{python} -m pytest -rA -p no:cacheprovider {test_files}"
    return template.replace("{python}", python).replace("{test_files}", " ".join(shlex.quote(t) for t in tests))


def env_prefix(python: str, harness_env: bool = False) -> str:
    """Shell that puts the row's environment first on ``PATH`` (the folder of its ``python``, as the
    harness's ``conda activate`` does: ``tox``, ``pytest`` and the scripts the environment installed
    are found) and, for a harness-built environment, lets pytest load the plugins installed in it
    (as the harness runs pytest; the local sandbox turns autoload off by default)."""
    out = ""
    if os.path.isabs(python):
        out += f"export PATH={shlex.quote(os.path.dirname(python))}:\"$PATH\"; "
    if harness_env:
        out += "unset PYTEST_DISABLE_PLUGIN_AUTOLOAD; "
    return out


def env_mounts(python: str) -> list[str]:
    """Host folders a prepared environment needs at the same paths (the docker backend mounts them
    read-only; the local sandbox finds them itself): the venv and its base interpreter's prefix."""
    if not os.path.isabs(python):
        return []
    venv = os.path.dirname(os.path.dirname(python))
    out = [venv]
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    out.append(os.path.dirname(os.path.realpath(value.strip())))
    except OSError:
        pass
    return out


def _graded_command(python: str, test_command: str, prefix: str = "") -> str:
    """Probe the interpreter (a verdict that says why when it cannot start), run the tests into a
    log, grade the log as SWE-bench does (:mod:`.swebench_grading`), remove the log. The grader
    runs isolated (``-I``: neither the work dir nor PYTHONPATH on its path), so a ``json.py`` the
    agent writes cannot stand in for the standard library and fake the verdict. ``prefix`` (the
    environment's ``PATH``, the harness's own ``eval_commands``) runs in the tests' subshell."""
    q = shlex.quote(python)
    # the reason goes into the summary section, so the verdict's one failed "test" says it
    why = (f"ERROR [the test interpreter {python} cannot start in the sandbox: the sandbox must see it, its "
           "prefix and its shared libraries (--python sets the local sandbox's interpreter too)]")
    probe = (f"if ! __err=$({q} -c 'import sys' 2>&1); then echo \"$__err\"; "
             f"echo '{'=' * 20} short test summary info {'=' * 20}'; echo {shlex.quote(why)}; exit 3; fi")
    return (f"{probe}; ( {prefix}{test_command} ) > {GRADE_LOG} 2>&1; __trc=$?; "
            f"{q} -I {GRADER_FILE} {GRADE_SPEC} {GRADE_LOG} $__trc; "
            f"__rc=$?; rm -f {GRADE_LOG}; exit $__rc")


def _grading_files(row: Mapping[str, Any], spec: Mapping[str, Any], f2p: tuple[str, ...],
                   p2p: tuple[str, ...]) -> dict[str, str]:
    payload = {"repo": row["repo"], "log_parser": spec["log_parser"], "FAIL_TO_PASS": list(f2p),
               "PASS_TO_PASS": list(p2p)}
    with open(grading.__file__, encoding="utf-8") as fh:
        source = fh.read()
    return {GRADER_FILE: source, GRADE_SPEC: json.dumps(payload)}


def _row_fields(row: Mapping[str, Any], where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Validate the row's required fields; its FAIL_TO_PASS and PASS_TO_PASS."""
    for key in REQUIRED:
        if not isinstance(row.get(key), str) or not row.get(key):
            raise SWEBenchError(f"{where}: {key}: missing or empty")
    f2p, p2p = _test_list(row, "FAIL_TO_PASS", where), _test_list(row, "PASS_TO_PASS", where)
    if not f2p:
        raise SWEBenchError(f"{where}: FAIL_TO_PASS: empty (a row must name the tests its fix makes pass; "
                            "without them doing nothing would succeed)")
    try:
        _validate_spec(f"{where}: ", {k: row[k] for k in SPEC_KEYS if row.get(k) is not None})
    except ValueError as exc:
        raise SWEBenchError(str(exc)) from None
    return f2p, p2p


def row_to_task(row: Mapping[str, Any], config: SWEBenchConfig, where: str | None = None) -> Task:
    """One SWE-bench row as a Task (see the module docstring); raises :class:`SWEBenchError` naming
    ``where`` (``file:line``), the instance and the field."""
    where = f"{where + ': ' if where else ''}{row.get('instance_id') or '<no instance_id>'}"
    f2p, p2p = _row_fields(row, where)
    iid, repo, base = row["instance_id"], row["repo"], row["base_commit"]
    tests = get_test_directives(row["test_patch"], row["repo"])
    if not tests:
        raise SWEBenchError(f"{where}: test_patch: touches no test file")
    spec = row_spec(row, config)
    origin: dict[str, Any] = {
        "instance_id": iid, "repo": repo, "base_commit": base,
        "test_patch": row["test_patch"], "FAIL_TO_PASS": list(f2p), "PASS_TO_PASS": list(p2p),
        "test_files": tests, "version": row.get("version"), "log_parser": grading.parser_name(repo, spec["log_parser"]),
        "environment_setup_commit": row.get("environment_setup_commit"),
    }
    runtime: dict[str, Any] = {}
    hidden = _grading_files(row, spec, f2p, p2p)
    graded_sources: dict[str, str] = {}  # the graded test files after test_patch (images: in the image, not read)
    if config.use_images:
        python = spec["python"] or IMAGE_PYTHON
        files: dict[str, str] = {}
        command = _image_check_command(row, _graded_command(python, _test_command(spec["test_command"], python, tests)))
        hidden[TEST_PATCH_FILE] = row["test_patch"]
        runtime["workdir"] = "/testbed"
        image = image_name(iid, config.image_namespace, config.image_tag, config.arch)
    else:
        python = spec["python"] or "python"
        if spec.get("not_gradable") and not spec.get("checkout"):  # never run (e.g. not prepared): not read
            files, skipped, test_files = {}, [], {}
        else:
            files, skipped, test_files = _local_files(row, config, spec, where)
        graded_sources = test_files
        hidden.update(test_files)
        prepared = bool(spec.get("checkout"))
        prefix = (env_prefix(python, harness_env=True) if prepared else "") + "".join(f"{c}; " for c in spec["pre_test"])
        command = _graded_command(python, _test_command(spec["test_command"], python, tests), prefix)
        origin.update(repo_path=os.path.abspath(_checkout_of(row, config, spec)), skipped_files=skipped)
        if prepared:  # the sandbox copies the prepared tree itself: modes, symlinks, binary and built files
            runtime["work_tree"] = os.path.abspath(spec["checkout"])
            runtime["ro_mounts"] = tuple(env_mounts(python))
        image = None
    # a required test that reaches a remote host fails here for a reason the row does not name
    why = spec.get("not_gradable") or network_reason(graded_sources, f2p + p2p)
    setup = tuple(spec["setup"])
    if runtime.get("work_tree") and os.path.isabs(python):  # the agent's shell has the row's environment too
        setup = (env_prefix(python).strip().rstrip(";"), *setup)
    check = Check(kind="script", command=command, must_pass=f2p + p2p, hidden_files=hidden, timeout_s=config.test_timeout_s)
    return Task(id=iid, kind="code", instruction=_instruction(row), files=files, check=check, setup=setup,
                max_turns=config.max_turns, time_limit_s=config.time_limit_s, docker_image=image,
                source="swebench", runtime=Runtime(python=python, **runtime), grading=Grading(not_gradable=why or None),
                reference=Reference(gold_patch=row["patch"]), origin=origin)


def _local_files(row: Mapping[str, Any], config: SWEBenchConfig, spec: Mapping[str, Any],
                 where: str) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """(files at base_commit plus generated ones, the paths left out, the post-test_patch test
    files). Errors name ``where`` and the field at fault."""
    try:
        repo_path = _checkout_of(row, config, spec)
    except SWEBenchError as exc:
        raise SWEBenchError(f"{where}: {exc}") from None
    if not is_commit(repo_path, row["base_commit"]):
        raise SWEBenchError(f"{where}: base_commit: {row['base_commit']} is not a commit of {repo_path} "
                            "(fetch the repository's full history)")
    if spec.get("checkout"):
        files, skipped = tree_files(repo_path, row["base_commit"], config.max_file_bytes, where)
    else:
        files, skipped = files_at(repo_path, row["base_commit"], config.max_file_bytes)
    try:
        if spec["generated_files"]:
            files.update(generated_files(repo_path, row["base_commit"], spec["generated_files"], config.max_file_bytes))
        apply_patch(files, row["patch"], "patch (the gold fix)")
        patched = apply_patch(files, row["test_patch"], "test_patch")
    except SWEBenchError as exc:
        raise SWEBenchError(f"{where}: {exc}") from None
    deleted = [p for p, c in patched.items() if c is None]
    if deleted:
        log.warning("%s: test_patch deletes %s; deletions are not applied before grading", where, deleted)
    return files, skipped, {p: c for p, c in patched.items() if c is not None}


def _checkout_of(row: Mapping[str, Any], config: SWEBenchConfig, spec: Mapping[str, Any]) -> str:
    """The spec's ``checkout`` (a work tree of this instance, e.g. made by ``compactrl tasks
    prepare``), else the repository's checkout under ``repos_root``/``repo_paths``."""
    if spec.get("checkout"):
        if not os.path.isdir(spec["checkout"]):
            raise SWEBenchError(f"checkout: no folder {spec['checkout']} (run `compactrl tasks prepare` again)")
        return spec["checkout"]
    try:
        return checkout_path(row["repo"], config)
    except SWEBenchError as exc:
        raise SWEBenchError(f"repo: {exc}") from None


def _image_check_command(row: Mapping[str, Any], graded: str) -> str:
    """Reset the test files to ``base_commit``, apply the hidden test patch, run and grade, restore."""
    touched = patch_targets(row["test_patch"])
    new = re.findall(r"^diff --git a/.* b/(.*)\nnew file mode", row["test_patch"], flags=re.MULTILINE)
    modified = [p for p in touched if p not in new]
    q = " ".join(shlex.quote(p) for p in modified)
    n = " ".join(shlex.quote(p) for p in new)
    reset = (f"git checkout -q {row['base_commit']} -- {q} 2>/dev/null; " if modified else "") + (
        f"rm -f {n}; " if new else "")
    return (f"{reset}if git apply --whitespace=nowarn {TEST_PATCH_FILE}; then ( {graded} ); __rc=$?; "
            f"else echo 'compactrl: the hidden test_patch does not apply'; __rc=4; fi; {reset}exit $__rc")


def load_swebench(source: str | Iterable[Mapping[str, Any]], config: SWEBenchConfig, *,
                  instance_ids: Iterable[str] | None = None) -> list[Task]:
    """Tasks from a SWE-bench ``.json``/``.jsonl`` file (or rows), optionally only ``instance_ids``."""
    if isinstance(source, str):
        located = read_located_rows(source)
    else:
        located = [(f"row {i}", dict(r)) for i, r in enumerate(source)]
    wanted = set(instance_ids) if instance_ids is not None else None
    tasks = [row_to_task(r, config, where) for where, r in located if wanted is None or r.get("instance_id") in wanted]
    if wanted is not None and len(tasks) != len(wanted):
        found = {t.id for t in tasks}
        raise SWEBenchError(f"instance ids not in {source if isinstance(source, str) else 'the rows'}: "
                            f"{sorted(wanted - found)}")
    return tasks
