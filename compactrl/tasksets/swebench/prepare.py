"""Environments for SWE-bench rows on the local sandbox, built from the harness's own specs.

:func:`prepare` does, per (repository, version) of the rows, what the harness's environment image
does, with a venv in place of a conda env: find the pinned interpreter (pyenv, uv, ``pythonX.Y``
on ``PATH``), create ``envs_root/envs/<owner>__<name>@<version>``, install the spec's
``packages`` (a requirements file read from the repository at ``environment_setup_commit``, or
a package list) and ``pip_packages``. Per row it does what the instance image does: a git work
tree of the checkout at ``base_commit`` (``envs_root/checkouts/<instance_id>``), a copy of the
venv (``envs_root/envs/<instance_id>``: an install may move dependencies), the spec's
``pre_install`` and ``install`` commands run in the work tree with that copy first on ``PATH``. The install
step's paths are then moved to the sandbox's work dir (an editable install's ``.pth``, finder or
``egg-link`` name the work tree; inside the sandbox the repository is at ``/workspace``), so the
tests import the agent's files, and the files the install step generated (``_version.py``,
``*.egg-info``) are listed for the loader to copy.

It writes ``envs_root/specs.json`` (for ``--swebench-specs``: per ``owner/name@version`` the
``test_command``, per instance the ``python``, ``checkout`` and ``generated_files``) and
``envs_root/manifest.json`` (per instance the requested and used Python, every command run, and
what was skipped or failed). A prepared environment or work tree carries a stamp written last and
is reused; one without a stamp (an interrupted build) is removed and built again.

The harness's specs (``MAP_REPO_VERSION_TO_SPECS``, ``MAP_REPO_TO_REQS_PATHS``) live in the
``swebench`` package up to 4.x; 5.x moved them out of the package. :func:`harness_specs` imports
them in this interpreter, or in ``harness_python`` (an interpreter with ``swebench<5``), or reads
them from a JSON file of the same shape.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compactrl.tasksets.swebench.rows import SWEBenchError, _git, is_commit, read_located_rows
from compactrl.tasksets.swebench.submodules import SubmoduleError
from compactrl.tasksets.swebench.submodules import supply as supply_submodules

log = logging.getLogger(__name__)

STAMP = ".compactrl-prepared.json"
"""Written last into a finished venv or work tree; its absence means "build again"."""
SANDBOX_WORKDIR = "/workspace"
"""Where the local sandbox puts the repository (``LocalSandboxConfig.workdir``)."""
SKIPPED_PREFIXES = ("apt-get", "apt ", "sudo ", "locale-gen", "dpkg", "update-locale")
"""``pre_install`` commands on the system (its package manager, its locales): a venv cannot hold
them, and prepare must not change the machine it runs on (recorded, see :func:`on_system`)."""
_SYSTEM_WRITE = re.compile(r"(>>?|\bsed\s+-i\b[^|;&]*|\b(cp|mv|tee|ln|rm)\b[^|;&]*)\s+['\"]?/(etc|usr|var|lib|bin|sbin|opt|root)/")


def on_system(command: str) -> bool:
    """Whether a setup line acts on the machine rather than the work tree: the system package
    manager, locale generation, or a write to a system folder (``echo ... > /etc/locale.gen``)."""
    text = command.strip()
    return text.startswith(SKIPPED_PREFIXES) or bool(_SYSTEM_WRITE.search(text))
GENERATED_SKIP = ("__pycache__/", "build/", ".eggs/", ".tox/", STAMP)
"""Untracked paths an install leaves that are not part of the installed tree."""
PYTHON_MINORS = [f"3.{m}" for m in range(5, 15)]
"""Interpreter versions looked for when the pinned one is missing (the fallback's candidates)."""

_READ_SPECS = ("import json, swebench.harness.constants as c; "
               "print(json.dumps({'specs': c.MAP_REPO_VERSION_TO_SPECS, "
               "'reqs_paths': getattr(c, 'MAP_REPO_TO_REQS_PATHS', {}), "
               "'env_yml_paths': getattr(c, 'MAP_REPO_TO_ENV_YML_PATHS', {})}, default=str))")


class PrepareError(ValueError):
    """What stops an environment or an instance from being prepared (names which, and why)."""


@dataclass(frozen=True)
class PrepareConfig:
    """Where :func:`prepare` reads and writes, and how strictly it matches interpreters."""

    repos_root: str
    """Folder of git repositories (bare or not) named ``<owner>__<name>``, with full history."""
    envs_root: str
    """Folder for the venvs, the work trees, ``specs.json`` and ``manifest.json``."""
    harness_python: str | None = None
    """An interpreter with ``swebench<5`` to read the harness specs from (default: this one)."""
    harness_specs: str | None = None
    """A JSON file ``{"specs": {repo: {version: spec}}, "reqs_paths": {repo: [paths]}}`` (wins)."""
    strict_python: bool = False
    """Fail when the pinned Python is missing, instead of using the nearest available one."""
    workdir: str = SANDBOX_WORKDIR
    """The repository's path inside the sandbox, which installs are moved to."""
    pip_args: tuple[str, ...] = ()
    """Extra ``pip install`` arguments (e.g. ``--find-links /wheels --no-index`` offline)."""
    command_timeout_s: float = 3600.0
    """Limit of one step (the venv, one install command, a row's install script), in seconds; a step
    that passes it is killed and named in the error."""
    instance_ids: tuple[str, ...] | None = None
    """Only these rows (default: all)."""
    exclude_newer: str | None = "2024-08-13"
    """Packages released after this date (``YYYY-MM-DD``) are not installed (uv's
    ``--exclude-newer``): requirements the specs leave open resolve as they did when the rows were
    validated (SWE-bench Verified's release), not to today's releases (docutils 0.22 dropped the
    ``roman`` module sphinx 3.5's LaTeX writer imports). None: no bound. pip has no such option: with
    pip (Python < 3.8, or ``resolver="pip"``) the bound is not applied (recorded)."""
    download_cache: str | None = None
    """A folder of files fetched ahead from wherever they can be reached, found by their content
    (see :func:`download_cache_index`): ``<sha256>`` files a build would download (listed with the
    URLs they stand for in ``urls.txt``), ``<git blob id>`` files a checkout lacks. None: none."""
    install_system_packages: bool = False
    """Before building: ``apt-get install`` the packages the rows' ``pre_install`` installs in the
    harness's image and this machine lacks (needs root; the Terminal-Bench loader's
    :func:`~compactrl.tasksets.system_packages.install_system_packages`: each command printed and
    recorded, here also in ``manifest.json``'s ``system_packages``). Without it such rows are flagged
    not gradable (matplotlib's tests need ghostscript, LaTeX, ffmpeg, ImageMagick as its image has them)."""
    resolver: str = "auto"
    """Who installs the packages: ``uv`` (``uv pip install``, where uv supports the interpreter:
    Python >= 3.8), ``pip`` (the venv's pip, upgraded first to the newest that supports its Python),
    or ``auto`` (uv when it is installed, else pip)."""

    def __post_init__(self) -> None:
        for name in ("repos_root", "envs_root"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"PrepareConfig.{name}: expected a folder path, got {getattr(self, name)!r}")
        if not os.path.isdir(self.repos_root):
            raise ValueError(f"PrepareConfig.repos_root: {self.repos_root!r} is not a folder")
        if not self.workdir.startswith("/"):
            raise ValueError(f"PrepareConfig.workdir: expected an absolute path, got {self.workdir!r}")
        if not self.command_timeout_s > 0:
            raise ValueError(f"PrepareConfig.command_timeout_s: expected > 0, got {self.command_timeout_s!r}")
        if self.exclude_newer is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", self.exclude_newer):
            raise ValueError(f"PrepareConfig.exclude_newer: expected YYYY-MM-DD or None, got {self.exclude_newer!r}")
        if self.resolver not in ("auto", "uv", "pip"):
            raise ValueError(f"PrepareConfig.resolver: expected 'auto', 'uv' or 'pip', got {self.resolver!r}")
        if self.download_cache is not None and not os.path.isdir(self.download_cache):
            raise ValueError(f"PrepareConfig.download_cache: {self.download_cache!r} is not a folder")
        if self.harness_specs is not None and not os.path.isfile(self.harness_specs):
            raise ValueError(f"PrepareConfig.harness_specs: no file {self.harness_specs!r}")


@dataclass
class PrepareReport:
    """What :func:`prepare` did: per instance its manifest record, the failures by id, the files."""

    prepared: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    system_packages: dict[str, Any] = field(default_factory=dict)
    """What ``install_system_packages`` did: ``{"wanted", "installed", "unavailable"}`` (empty: not asked)."""
    specs_path: str = ""
    manifest_path: str = ""


# ===================================================================== the harness's specs
def harness_specs(python: str | None = None, path: str | None = None) -> dict[str, Any]:
    """``{"specs": {repo: {version: spec}}, "reqs_paths": {...}, "env_yml_paths": {...}}`` from a
    JSON file, from ``swebench.harness.constants`` in ``python``, or imported here."""
    if path is not None:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
        if not isinstance(value, dict) or not isinstance(value.get("specs"), dict):
            raise PrepareError(f"{path}: expected {{'specs': {{repo: {{version: spec}}}}, 'reqs_paths': ...}}")
        return {"reqs_paths": {}, "env_yml_paths": {}, **value}
    if python is not None:
        res = subprocess.run([python, "-c", _READ_SPECS], capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise PrepareError(f"cannot read the harness specs with {python}: "
                               f"{_missing_specs_hint(res.stderr.strip().splitlines()[-1:] or [''])}")
        return json.loads(res.stdout)
    try:
        import swebench.harness.constants as constants
    except ImportError as exc:
        raise PrepareError(f"the harness specs need the swebench package (<5): {exc}; "
                           "pip install 'swebench<5', or pass harness_python / harness_specs") from None
    if not hasattr(constants, "MAP_REPO_VERSION_TO_SPECS"):
        raise PrepareError(_missing_specs_hint([f"swebench {_swebench_version()} has no MAP_REPO_VERSION_TO_SPECS"]))
    return {"specs": constants.MAP_REPO_VERSION_TO_SPECS,
            "reqs_paths": getattr(constants, "MAP_REPO_TO_REQS_PATHS", {}),
            "env_yml_paths": getattr(constants, "MAP_REPO_TO_ENV_YML_PATHS", {})}


def _swebench_version() -> str:
    import swebench

    return getattr(swebench, "__version__", "?")


def _missing_specs_hint(lines: list[str]) -> str:
    return (f"{lines[-1]} (swebench 5 moved the per-version environment specs out of the package; "
            "install swebench>=4,<5 in an interpreter and pass it as harness_python (--harness-python), "
            "or pass a JSON dump as harness_specs (--harness-specs))")


def env_spec(specs: Mapping[str, Any], repo: str, version: str, where: str) -> dict[str, Any]:
    """The harness spec of ``repo@version`` (a PrepareError naming ``where`` if there is none)."""
    by_version = specs["specs"].get(repo)
    if by_version is None:
        raise PrepareError(f"{where}: repo: {repo!r} has no harness spec (known: {len(specs['specs'])} repositories)")
    if version not in by_version:
        raise PrepareError(f"{where}: version: {version!r} of {repo} has no harness spec "
                           f"(known: {sorted(by_version)})")
    return dict(by_version[version])


# ===================================================================== interpreters
def probe_python(candidate: str) -> tuple[str, str] | None:
    """(real executable, ``"X.Y"``) of an interpreter that starts, else None."""
    try:
        res = subprocess.run([candidate, "-c", "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.split()
    return (lines[0], lines[1]) if res.returncode == 0 and len(lines) == 2 else None


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` (``"3.9"``): pyenv's versions, ``uv python find``,
    ``pythonX.Y`` on ``PATH``, then the running one; the first that starts and reports that version."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")), reverse=True)
    uv = shutil.which("uv")
    if uv:
        res = subprocess.run([uv, "python", "find", "--no-python-downloads", version], capture_output=True,
                             text=True, timeout=60)
        candidates += [res.stdout.strip()] if res.returncode == 0 and res.stdout.strip() else []
    candidates += [p for p in [shutil.which(f"python{version}"), sys.executable] if p]  # last: this one
    for cand in candidates:
        found = probe_python(cand)
        if found and found[1] == version:
            return found[0]
    return None


def choose_python(version: str, strict: bool, where: str) -> tuple[str, str]:
    """(interpreter, its version): the pinned one, else (unless ``strict``) the nearest available
    minor version, the newer on a tie; a PrepareError naming what to install otherwise."""
    found = find_python(version)
    if found:
        return found, version
    hint = f"install it (pyenv install {version}, or uv python install {version})"
    if strict:
        raise PrepareError(f"{where}: python: {version} is not available here (pyenv, uv, PATH); {hint}")
    available = {v: p for v in PYTHON_MINORS if (p := find_python(v))}
    if not available:
        raise PrepareError(f"{where}: python: no Python 3 interpreter found (wanted {version}); {hint}")
    want = _minor(version)
    best = min(available, key=lambda v: (abs(_minor(v) - want), -_minor(v)))
    log.warning("%s: Python %s is not available; using the nearest, %s (%s); %s", where, version, best,
                available[best], hint)
    return available[best], best


def _minor(version: str) -> int:
    return int(version.split(".")[1])


# ===================================================================== commands
Progress = Callable[[str], None]
"""Receives one-line progress messages (the CLI prints them); None: logged only."""
HEARTBEAT_S = 15.0
"""How often a running step reports that it is still running (with its log's last line)."""


def _run(command: str | list[str], cwd: str, env_dir: str, timeout_s: float, what: str, log_path: str | None = None,
         progress: Progress | None = None, extra_env: Mapping[str, str] | None = None) -> float:
    """Run one step with the venv first on ``PATH``, its output streamed to ``log_path`` (appended;
    a temp file when None) and a progress line every :data:`HEARTBEAT_S`; its seconds, or a
    PrepareError naming ``what``, the step's time limit and the log's tail."""
    env = {**os.environ, "PATH": f"{env_dir}/bin:{os.environ.get('PATH', '')}", "VIRTUAL_ENV": env_dir,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1", "PIP_NO_INPUT": "1"}
    extra = dict(extra_env or {})
    if "PATH_PREFIX" in extra:  # after the venv, before the system (the download cache's wget/curl)
        env["PATH"] = f"{env_dir}/bin:{extra.pop('PATH_PREFIX')}:{os.environ.get('PATH', '')}"
    env.update(extra)
    # pip compiles bytecode only when allowed; the sandbox's venv is read-only, so modules without
    # it compile at every import, and a DeprecationWarning of that compile fails the run under
    # ``filterwarnings = error`` (as the harness's env, which has the bytecode, never does)
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    # uv does not compile by default (pip does): without this, flask 2.2's blinker 1.4 fails to import
    # under flask's ``filterwarnings = error`` (an invalid escape in a docstring, warned at compile)
    env["UV_COMPILE_BYTECODE"] = "1"
    shown = command if isinstance(command, str) else shlex.join(command)
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="compactrl-prepare-", suffix=".log")
        os.close(fd)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as out:
        out.write(f"\n$ {shown}    # {what}, in {cwd}\n".encode())
        out.flush()
        proc = subprocess.Popen(command, cwd=cwd, env=env, shell=isinstance(command, str), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait(proc, start, timeout_s, what, shown, log_path, progress)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM via the CLI): the step must not outlive prepare
            _kill_group(proc)
            raise
    if proc.returncode != 0:
        raise PrepareError(f"{what}: `{shown}` exited {proc.returncode} (output: {log_path}):\n{_tail(log_path)}")
    return time.monotonic() - start


def _wait(proc: subprocess.Popen, start: float, timeout_s: float, what: str, shown: str, log_path: str,
          progress: Progress | None) -> None:
    """Until the step ends; killed past ``timeout_s`` (a PrepareError naming it); a progress line
    every :data:`HEARTBEAT_S`."""
    beat = start
    while proc.poll() is None:
        now = time.monotonic()
        if now - start > timeout_s:
            _kill_group(proc)
            raise PrepareError(f"{what}: `{shown}` did not finish within its step limit of {timeout_s:.0f} s "
                               f"(output: {log_path}):\n{_tail(log_path)}\nTry: a larger --step-timeout; for a "
                               "resolver that backtracks, pin the packages it wavers on (--pip-arg), or install "
                               "uv (faster resolver, used for Python >= 3.8 when found)")
        if progress is not None and now - beat >= HEARTBEAT_S:
            beat = now
            progress(f"{what}: running {now - start:.0f} s  | {_tail(log_path, 1)[:120]}")
        time.sleep(0.2)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.strip().splitlines()[-lines:])


BUILD_TOOL_CAPS: dict[str, tuple[str, ...]] = {"3.5": ("cython<3",), "3.6": ("cython<3",), "3.7": ("cython<3",)}
"""Per pinned Python, the build tools the harness's conda environment could not have had: conda's
``defaults`` channel builds packages only for supported Pythons, and Cython 3.0.0 (2023-07-17) came
after Python 3.6 (end of life 2021-12) and 3.7 (2023-06-27) were retired, so a spec that leaves
``cython`` open (scikit-learn 0.20-0.22 on Python 3.6) got a 0.29 release there; pip takes Cython
3.0.x, which cannot compile those trees (of the swebench 4.1 specs on Python 3.5-3.7 only those and
astropy 0.1-1.3, which pins ``cython==0.27.3``, name cython). Applied by :func:`build_env` as a pip/uv constraints file
(``-c``) to every package install of such an environment, and recorded (``build_tool_caps``)."""

PIP_FOR_PYTHON = {"3.5": "pip<21", "3.6": "pip<22", "3.7": "pip<24.1", "3.8": "pip<25.1"}
"""The newest pip that still runs on each old interpreter (a venv's bundled pip may be too old to
honour ``requires-python``: pip 18 on 3.6 picks packages that need 3.10); newer ones get the newest."""


def _installer(env_dir: str, version: str, config: PrepareConfig, where: str, log_path: str,
               progress: Progress | None) -> list[str]:
    """The command prefix that installs packages into the venv: ``uv pip install --python ...`` where
    uv is found and supports the interpreter (>= 3.8), else the venv's pip, first upgraded to the
    newest release that supports its Python (:data:`PIP_FOR_PYTHON`)."""
    python = os.path.join(env_dir, "bin", "python")
    uv = _find_uv() if config.resolver in ("auto", "uv") else None
    if config.resolver == "uv" and uv is None:
        raise PrepareError(f"{where}: resolver: uv was asked for but is not installed (pip install uv)")
    if uv and _minor(version) >= 8:
        return [*uv, "pip", "install", "--python", python]
    pin = PIP_FOR_PYTHON.get(version, "pip")
    _run([python, "-m", "pip", "install", *config.pip_args, "--upgrade", pin], env_dir, env_dir,
         config.command_timeout_s, f"{where}: upgrade pip ({pin})", log_path, progress)
    return [python, "-m", "pip", "install"]


def _find_uv() -> list[str] | None:
    found = shutil.which("uv")
    if found:
        return [found]
    try:
        from uv import find_uv_bin

        return [find_uv_bin()]
    except (ImportError, FileNotFoundError):
        return None


def requirements(repo_path: str, repo: str, commit: str, paths: Sequence[str], where: str) -> list[str]:
    """The lines of the first of ``paths`` that exists at ``commit``, ``-r`` includes inlined
    and the repository itself (``-e .``, ``.``) left out, as the harness does."""
    for path in paths:
        if _exists(repo_path, commit, path):
            return _requirement_lines(repo_path, commit, path)
    raise PrepareError(f"{where}: packages: none of the requirement files {list(paths)} of {repo} exists at {commit[:12]}")


def _exists(repo_path: str, commit: str, path: str) -> bool:
    res = subprocess.run(["git", "-C", repo_path, "cat-file", "-e", f"{commit}:{path}"], capture_output=True, timeout=60)
    return res.returncode == 0


def _requirement_lines(repo_path: str, commit: str, path: str) -> list[str]:
    out = []
    for line in _git(repo_path, "show", f"{commit}:{path}").decode().splitlines():
        line = line.strip()
        if line.startswith("-r"):
            included = os.path.normpath(os.path.join(os.path.dirname(path), line[2:].strip()))
            out += _requirement_lines(repo_path, commit, included)
        elif line and not line.startswith(("#", "-e .", "-e.", ".[test")) and line != ".":
            out.append(line)
    return out


# ===================================================================== environments
def env_key(repo: str, version: str) -> str:
    return f"{repo.replace('/', '__')}@{version}"


def _read_stamp(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, STAMP), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _write_stamp(folder: str, record: Mapping[str, Any]) -> None:
    tmp = os.path.join(folder, STAMP + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(folder, STAMP))


def build_env(row: Mapping[str, Any], spec: Mapping[str, Any], harness: Mapping[str, Any], repo_path: str,
              config: PrepareConfig, where: str, progress: Progress | None = None) -> dict[str, Any]:
    """The venv of the row's (repo, version), reused when stamped; its record (python, commands).
    Every step's output goes to ``envs_root/logs/<owner>__<name>@<version>.log``."""
    key = env_key(row["repo"], row["version"])
    env_dir = os.path.join(os.path.abspath(config.envs_root), "envs", key)
    stamp = _read_stamp(env_dir)
    if (stamp is not None and os.path.exists(stamp.get("python", ""))
            and stamp.get("build_tool_caps", []) == list(build_tool_caps(stamp.get("python_version", "")))
            and _same_bound(stamp, config.exclude_newer) and (stamp.get("installer") != "uv" or stamp.get("bytecode"))):
        # (one built before its caps were known, under another date bound, or by uv without bytecode, is
        # built again; one whose prepare did not record its bound yet is reused, its bound "not recorded")
        return {"exclude_newer": "not recorded" if stamp.get("installer") == "uv" else None, **stamp, "reused": True}
    if os.path.exists(env_dir):  # an interrupted build: start again
        shutil.rmtree(env_dir)
    log_path = os.path.join(os.path.abspath(config.envs_root), "logs", f"{key}.log")
    interpreter, used = choose_python(str(spec.get("python", "3")), config.strict_python, where)
    record: dict[str, Any] = {"python_requested": str(spec.get("python")), "python_version": used,
                              "base_interpreter": interpreter, "python": os.path.join(env_dir, "bin", "python"),
                              "commands": [], "env_dir": env_dir, "log": log_path, "skipped_packages": []}
    start = time.monotonic()
    if progress:
        progress(f"{where}: building the environment {key} (python {used}; log: {log_path})")
    # pip only where something installs with it (a venv without it is made in a second, offline)
    uses_pip = any(spec.get(k) for k in ("packages", "pip_packages")) or "pip" in json.dumps(
        [spec.get("pre_install"), spec.get("install")])
    _run([interpreter, "-m", "venv", *([] if uses_pip else ["--without-pip"]), env_dir], config.envs_root, env_dir,
         config.command_timeout_s, f"{where}: venv", log_path, progress)
    optional: list[str] = []
    installs = _package_installs(row, spec, harness, repo_path, env_dir, where, record["skipped_packages"], optional)
    if installs:
        installer = _installer(env_dir, used, config, where, log_path, progress)
        record["installer"] = os.path.basename(installer[0]) if "uv" in os.path.basename(installer[0]) else "pip"
        caps = build_tool_caps(used)
        record["build_tool_caps"] = list(caps)
        for args in installs:
            extra = list(config.pip_args) if record["installer"] == "pip" else _uv_args(config.pip_args)
            if caps:
                extra += ["-c", _write_lines(env_dir, "build-tool-caps.txt", caps)]
            if record["installer"] != "pip" and config.exclude_newer:
                extra += ["--exclude-newer", config.exclude_newer]
            record["exclude_newer"] = config.exclude_newer if record["installer"] != "pip" else None
            _run([*installer, *extra, *args], env_dir, env_dir, config.command_timeout_s,
                 f"{where}: install {' '.join(args)[:80]}", log_path, progress)
            record["commands"].append(shlex.join([record["installer"], "install", *args]))
        _install_best_effort(optional, installer, extra, env_dir, config, where, log_path, progress, record)
    record["bytecode"] = True  # pip compiles by default, uv under UV_COMPILE_BYTECODE (see _run)
    record["build_s"] = round(time.monotonic() - start, 1)
    record["built_at"] = time.time()  # which build a row's venv was copied from
    _write_stamp(env_dir, record)
    if progress:
        progress(f"{where}: environment {key} built in {record['build_s']:.0f} s")
    return {**record, "reused": False}


def _same_bound(stamp: Mapping[str, Any], exclude_newer: str | None) -> bool:
    """Whether a stamped environment was installed under the date bound asked now (uv environments
    only: pip applies none); a stamp that does not record one counts as the same."""
    return stamp.get("installer") != "uv" or "exclude_newer" not in stamp or stamp["exclude_newer"] == exclude_newer


def _install_best_effort(packages: Sequence[str], installer: list[str], extra: list[str], env_dir: str,
                         config: PrepareConfig, where: str, log_path: str, progress: Progress | None,
                         record: dict[str, Any]) -> None:
    """:data:`BEST_EFFORT` packages, each alone, held to what is installed; a failure is recorded."""
    if not packages:
        return
    python = os.path.join(env_dir, "bin", "python")
    frozen = subprocess.run([python, "-m", "pip", "freeze"] if record["installer"] == "pip"
                            else [installer[0], "pip", "freeze", "--python", python],
                            capture_output=True, text=True, timeout=120).stdout.splitlines()
    held = _write_lines(env_dir, "installed-constraints.txt",
                        [x for x in frozen if re.fullmatch(r"[A-Za-z0-9_.\-]+==[^\s;@]+", x.strip())])
    for package in packages:
        try:
            _run([*installer, *extra, "-c", held, package], env_dir, env_dir, min(900.0, config.command_timeout_s),
                 f"{where}: install {package} (optional)", log_path, progress)
            record["commands"].append(shlex.join([record["installer"], "install", "-c", "installed", package]))
        except PrepareError as exc:
            log.warning("%s: optional %s not installed: %s", where, package, str(exc).splitlines()[-1][:200])
            record["skipped_packages"].append(f"{package} (optional: no release fits the environment)")


def build_tool_caps(python_version: str) -> tuple[str, ...]:
    """The constraints :data:`BUILD_TOOL_CAPS` puts on an environment of ``python_version``."""
    return BUILD_TOOL_CAPS.get(python_version, ())


def _uv_args(pip_args: Sequence[str]) -> list[str]:
    """pip's ``--find-links``/``--no-index``/``--index-url`` as uv spells them (the same names)."""
    return list(pip_args)


def _package_installs(row: Mapping[str, Any], spec: Mapping[str, Any], harness: Mapping[str, Any], repo_path: str,
                      env_dir: str, where: str, skipped: list[str] | None = None,
                      best_effort: list[str] | None = None) -> list[list[str]]:
    """The ``pip install`` argument lists of the spec's ``packages`` then ``pip_packages``. A conda
    ``environment.yml`` (read at ``environment_setup_commit``) becomes its pip-installable
    dependencies; those conda alone provides (compilers, ``python``, system libraries) are appended
    to ``skipped``."""
    out = []
    packages = spec.get("packages") or ""
    commit = row.get("environment_setup_commit") or row["base_commit"]
    if packages == "requirements.txt":
        lines = requirements(repo_path, row["repo"], commit, harness["reqs_paths"].get(row["repo"], []), where)
        out.append(["-r", _write_lines(env_dir, "requirements.txt", lines)])
    elif packages == "environment.yml":
        paths = harness.get("env_yml_paths", {}).get(row["repo"], ["environment.yml"])
        lines = environment_yml_requirements(repo_path, commit, paths, where, skipped if skipped is not None else [],
                                             best_effort)
        if lines:
            out.append(["-r", _write_lines(env_dir, "requirements-environment-yml.txt", lines)])
    elif packages.strip():  # conda's ``name=1.2`` is pip's ``name==1.2``
        out.append([re.sub(r"^([A-Za-z0-9_.\-\[\]]+)=(?!=)", r"\1==", p) for p in shlex.split(packages)])
    if spec.get("pip_packages"):
        out.append(list(spec["pip_packages"]))
    return out


def _write_lines(env_dir: str, name: str, lines: Sequence[str]) -> str:
    path = os.path.join(env_dir, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


CONDA_ONLY = {"python", "pip", "compilers", "c-compiler", "cxx-compiler", "ghostscript", "graphviz", "pkg-config",
              "qhull", "freetype", "libpng", "tk", "libgdal", "proj", "geos", "ffmpeg", "imagemagick", "texlive-core",
              "nodejs", "pandoc", "cairo", "gtk3", "gtk4", "pygobject", "wxpython", "pyqt", "pyside2", "pyside6",
              "cartopy", "tornado-gtk", "qt", "qt-main", "cdms2", "hdf5", "eccodes", "libnetcdf",
              "iris", "cfgrib", "pynio", "pseudonetcdf", "rasterio"}
"""conda packages a venv cannot take from PyPI as they are (system libraries, GUI stacks, binaries):
left out, recorded."""
BEST_EFFORT = {"sparse", "numbagg", "h5netcdf", "pint"}
"""Optional test dependencies of a conda ``environment.yml`` that PyPI has, but not for every
interpreter the environments pin: installed one by one after the rest, held to the versions
already installed (a constraints file of the environment's freeze), and recorded as skipped when
they cannot be (xarray's sparse and pint tests are graded: left out, they are skipped and missing)."""
CONDA_TO_PIP = {"pytables": "tables", "matplotlib-base": "matplotlib", "pytorch": "torch", "msgpack-python": "msgpack"}


def environment_yml_requirements(repo_path: str, commit: str, paths: Sequence[str], where: str,
                                 skipped: list[str], best_effort: list[str] | None = None) -> list[str]:
    """pip requirement lines of a conda ``environment.yml``: its conda dependencies (``name=1.2``
    as ``name==1.2``, conda-only ones in ``skipped``) and its ``pip:`` list."""
    import yaml

    for path in paths:
        if _exists(repo_path, commit, path):
            data = yaml.safe_load(_git(repo_path, "show", f"{commit}:{path}").decode()) or {}
            break
    else:
        raise PrepareError(f"{where}: packages: none of {list(paths)} exists at {commit[:12]}")
    out: list[str] = []
    for dep in data.get("dependencies") or []:
        if isinstance(dep, dict):
            out += [str(p) for p in dep.get("pip") or []]
            continue
        dep = str(dep).split("::")[-1].strip()
        name = re.split(r"[=<>! ]", dep, maxsplit=1)[0].lower()
        if name in CONDA_ONLY:
            skipped.append(dep)
            continue
        if name in BEST_EFFORT and best_effort is not None:
            best_effort.append(re.sub(r"^([A-Za-z0-9_.\-]+)=(?!=)", r"\1==", dep))
            continue
        rest = dep[len(name):].strip()
        rest = re.sub(r"^=(?!=)", "==", rest)
        out.append(CONDA_TO_PIP.get(name, name) + rest)
    return out


# ===================================================================== instances
def missing_blobs(repo_path: str, commit: str) -> list[tuple[str, str]]:
    """(path, blob id) of the files of ``commit``'s tree whose contents ``repo_path`` lacks (a
    snapshot or partial clone that left out its largest files)."""
    entries = []
    for item in _git(repo_path, "ls-tree", "-r", "-z", commit).split(b"\0"):
        if item:
            meta, _, path = item.decode("utf-8", "replace").partition("\t")
            mode, kind, sha = meta.split()
            if kind == "blob":
                entries.append((path, sha))
    if not entries:
        return []
    checked = _git(repo_path, "cat-file", "--batch-check", data="".join(f"{sha}\n" for _, sha in entries).encode())
    missing = {line.split()[0] for line in checked.decode().splitlines() if line.endswith(" missing")}
    return [(path, sha) for path, sha in entries if sha in missing]


def supply_blobs(repo_path: str, commit: str, cache: str | None, where: str) -> list[dict[str, str]]:
    """Before a work tree of ``commit``: every blob its tree needs that ``repo_path`` lacks is
    written into it (``git hash-object -w``) from the download cache, where a file of that git
    blob id is; the blobs added (path, blob, file). A PrepareError naming each blob still missing
    and how to supply it otherwise."""
    missing = missing_blobs(repo_path, commit)
    if not missing:
        return []
    index = download_cache_index(cache)["blob"] if cache else {}
    added, still = [], []
    for path, sha in missing:
        if sha in index:
            got = _git(repo_path, "hash-object", "-w", "--no-filters", index[sha]).decode().strip()
            if got != sha:  # download_cache_index checked it; the repository must agree
                raise PrepareError(f"{where}: download_cache: {index[sha]} was written as {got}, not {sha}")
            added.append({"path": path, "blob": sha, "file": index[sha]})
        else:
            still.append((path, sha))
    if still:
        listed = "; ".join(f"{path} (blob {sha})" for path, sha in still[:5])
        raise PrepareError(
            f"{where}: base_commit: {len(still)} file(s) of {commit[:12]}'s tree missing from the checkout: {listed} "
            f"({repo_path} lacks their contents: a snapshot or partial clone that left out its largest files). Supply "
            "each: put a file whose `git hash-object` is that blob id in the download cache "
            "(--download-cache DIR, named by the id: prepare checks it and adds it), or run "
            f"`git -C {repo_path} hash-object -w FILE` yourself, or fetch the repository's full history; a copy "
            "may be in a release of the project made while that blob was current (an sdist)")
    return added


def checkout(repo_path: str, commit: str, dest: str, where: str, cache: str | None = None) -> list[dict[str, str]]:
    """A detached git work tree of ``repo_path`` at ``commit`` in ``dest`` (a fresh one); blobs the
    checkout lacks come from the download cache (:func:`supply_blobs`), which are returned."""
    added = supply_blobs(repo_path, commit, cache, where)
    if os.path.exists(dest):
        shutil.rmtree(dest)
        _git(repo_path, "worktree", "prune")
    try:
        # twice --force: a worktree registered by a prepare that was killed is "missing but locked"
        _git(repo_path, "worktree", "add", "--detach", "--force", "--force", dest, commit)
    except SWEBenchError as exc:
        raise PrepareError(f"{where}: base_commit: {exc}") from None
    return added


# ===================================================================== the download cache
URLS_FILE = "urls.txt"
"""In a download cache: ``<sha256> <url>`` lines, the URLs a cached file stands for."""


def download_cache_index(folder: str) -> dict[str, dict[str, str]]:
    """The files of a download cache by content: ``{"sha256": {hex: path}, "blob": {git blob id:
    path}, "urls": {url: sha256}}``. Every regular file is indexed by both hashes; a file named by a
    hash (64 hex digits: sha256; 40: git blob id) must have it (a ValueError naming the file
    otherwise), and so must each ``urls.txt`` line's file."""
    out: dict[str, dict[str, str]] = {"sha256": {}, "blob": {}, "urls": {}}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name == URLS_FILE or not os.path.isfile(path):
            continue
        sha256, blob = file_hashes(path)
        if re.fullmatch(r"[0-9a-f]{64}", name) and name != sha256:
            raise ValueError(f"download_cache: {path}: named by a sha256 but its sha256 is {sha256}")
        if re.fullmatch(r"[0-9a-f]{40}", name) and name != blob:
            raise ValueError(f"download_cache: {path}: named by a git blob id but its blob id is {blob}")
        out["sha256"].setdefault(sha256, path)
        out["blob"].setdefault(blob, path)
    urls = os.path.join(folder, URLS_FILE)
    if os.path.isfile(urls):
        with open(urls, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                if len(words) != 2 or not re.fullmatch(r"[0-9a-f]{64}", words[0]):
                    raise ValueError(f"download_cache: {urls}:{number}: expected '<sha256> <url>', got {line.strip()!r}")
                if words[0] not in out["sha256"]:
                    raise ValueError(f"download_cache: {urls}:{number}: no file in {folder} has sha256 {words[0]} "
                                     f"(for {words[1]})")
                out["urls"][words[1]] = words[0]
    return out


def file_hashes(path: str) -> tuple[str, str]:
    """(sha256, git blob id) of a file's bytes."""
    import hashlib

    size = os.path.getsize(path)
    sha256, blob = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha256.update(chunk)
            blob.update(chunk)
    return sha256.hexdigest(), blob.hexdigest()


_FETCH_SHIM = """#!/bin/sh
# prepare's {tool}: a URL of the download cache is copied from it, anything else goes to the real {tool}
exec {python} -c 'import sys; from compactrl.tasksets.swebench.prepare import fetch_shim; \
sys.exit(fetch_shim(sys.argv[1], sys.argv[2], sys.argv[3:]))' {tool} {urls} "$@"
"""


def seed_download_cache(cache: str, dest: str, build_cache_names: Sequence[str]) -> dict[str, str]:
    """Where a build that downloads finds the cache's files: ``dest/xdg/<name>/<sha256>`` for each
    of ``build_cache_names`` (the layout of matplotlib's ``setupext``: ``$XDG_CACHE_HOME/matplotlib/
    <sha256>``, read instead of downloading; the user's other cache folders linked beside it), and
    ``wget``/``curl`` in ``dest/bin`` that copy a URL listed in ``urls.txt`` from the cache (its
    sha256 checked again) and pass any other to the real tool. The environment variables the
    install step gets (``XDG_CACHE_HOME``, ``PATH`` prefix)."""
    index = download_cache_index(cache)
    xdg = os.path.join(dest, "xdg")
    for name in build_cache_names:
        folder = os.path.join(xdg, name)
        os.makedirs(folder, exist_ok=True)
        for sha, path in index["sha256"].items():
            target = os.path.join(folder, sha)
            if not os.path.exists(target):
                shutil.copyfile(path, target)
    home_cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if os.path.isdir(home_cache):  # pip's cache and the others stay where they were
        for name in os.listdir(home_cache):
            link = os.path.join(xdg, name)
            if name not in build_cache_names and not os.path.lexists(link):
                os.symlink(os.path.join(home_cache, name), link)
    bindir = os.path.join(dest, "bin")
    os.makedirs(bindir, exist_ok=True)
    urls = os.path.join(dest, "urls.json")
    _write_json(urls, {"files": {url: index["sha256"][sha] for url, sha in index["urls"].items()},
                       "sha256": dict(index["urls"])})
    for tool in ("wget", "curl"):
        path = os.path.join(bindir, tool)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(_FETCH_SHIM.format(tool=tool, python=shlex.quote(sys.executable), urls=shlex.quote(urls)))
        os.chmod(path, 0o755)
    return {"XDG_CACHE_HOME": xdg, "PATH_PREFIX": bindir}


def fetch_shim(tool: str, urls_path: str, args: Sequence[str]) -> int:
    """``wget``/``curl`` during an install step: a URL of the download cache is copied to the output
    the command names (``-O FILE`` / ``-o FILE``; else the URL's base name), its sha256 checked; other
    commands run the real tool (found on ``PATH`` after the shim's folder)."""
    with open(urls_path, encoding="utf-8") as fh:
        loaded = json.load(fh)
    table, hashes = loaded["files"], loaded["sha256"]
    url = next((a for a in args if a in table), None)
    if url is None:
        shims = os.path.join(os.path.dirname(os.path.abspath(urls_path)), "bin")
        path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                               if p and os.path.abspath(p) != shims)
        real = shutil.which(tool, path=path)
        if real is None:
            print(f"{tool}: not installed, and none of {list(args)} is in the download cache", file=sys.stderr)
            return 127
        return subprocess.call([real, *args])
    flag = "-O" if tool == "wget" else "-o"
    out = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            out = args[i + 1]
        elif arg.startswith(flag) and len(arg) > 2:
            out = arg[2:]
        elif tool == "wget" and arg.startswith("--output-document="):
            out = arg.split("=", 1)[1]
        elif tool == "curl" and arg.startswith("--output="):
            out = arg.split("=", 1)[1]
    out = out or os.path.basename(url.split("?")[0])
    if file_hashes(table[url])[0] != hashes[url]:
        print(f"{tool}: the download cache's {table[url]} no longer has sha256 {hashes[url]} ({url})", file=sys.stderr)
        return 1
    shutil.copyfile(table[url], out)
    print(f"{tool}: {url} from the download cache ({table[url]}, sha256 {hashes[url]})", file=sys.stderr)
    return 0


# ===================================================================== bundled library sources
_SETUPEXT_VERSION = re.compile(r"^(TESTING_VERSION_OF_FREETYPE|LOCAL_FREETYPE_VERSION)\s*=\s*['\"]([\w.]+)['\"]", re.M)
_ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz")


def freetype_wanted(tree: str) -> dict[str, str] | None:
    """What a matplotlib work tree's ``setupext.py`` downloads to build its own FreeType, when it
    skips the download for sources already extracted in ``build/freetype-<version>`` (matplotlib
    3.3 and later: ``get_and_extract_tarball`` returns early when that folder exists):
    ``{"library", "version", "sha256", "file", "into"}``, else None. The version is
    ``TESTING_VERSION_OF_FREETYPE`` where the file defines it (3.5 and later, where
    ``LOCAL_FREETYPE_VERSION`` differs only on Windows ARM64), else its ``LOCAL_FREETYPE_VERSION``
    string; the sha256 is that version's entry of ``_freetype_hashes``."""
    path = os.path.join(tree, "setupext.py")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if "def get_and_extract_tarball" not in text or "toplevel.exists()" not in text:
        return None
    found = dict(_SETUPEXT_VERSION.findall(text))
    version = found.get("TESTING_VERSION_OF_FREETYPE") or found.get("LOCAL_FREETYPE_VERSION")
    if not version:
        return None
    sha = re.search(rf"['\"]{re.escape(version)}['\"]\s*:\s*['\"]([0-9a-f]{{64}})['\"]", text)
    return {"library": "freetype", "version": version, "sha256": sha.group(1) if sha else "",
            "file": f"freetype-{version}.tar.gz", "into": f"build/freetype-{version}"}


def _archive_names(index: Mapping[str, Mapping[str, str]], folder: str) -> list[tuple[str, str, str]]:
    """(path, name, sha256) of the download cache's files, each under its own name and under the
    base name of every URL ``urls.txt`` lists for it (a file kept under its sha256)."""
    by_path: dict[str, list[str]] = {}
    for url, sha in index["urls"].items():
        by_path.setdefault(index["sha256"][sha], []).append(os.path.basename(url.split("?")[0]))
    out = []
    for sha, path in index["sha256"].items():
        for name in [os.path.basename(path), *by_path.get(path, [])]:
            out.append((path, name, sha))
    return sorted(set(out))


def find_release(folder: str, library: str, version: str) -> dict[str, Any] | None:
    """A download cache's copy of ``library``'s ``version`` release sources, in any archive format:
    ``<library>-<version>.tar.{gz,bz2,xz}`` (or ``.tgz``), or a Debian/Ubuntu source package's
    ``<library>_<version>.orig.tar.*`` that holds that archive (the older multi-tarball layout:
    ``<library>-<version>/<library>-<version>.tar.bz2`` beside the docs) or the release's folder.
    The release is the archive's ``<library>-<version>/`` folder; for FreeType its
    ``include/freetype/freetype.h`` must also define that version (a wrong release is not used).
    ``{"archive", "archive_sha256", "member", "member_sha256"}`` (member: the inner archive, or
    None), or None."""
    import hashlib
    import io

    index = download_cache_index(folder)
    plain = {f"{library}-{version}{s}" for s in _ARCHIVE_SUFFIXES}
    orig = {f"{library}_{version}.orig{s}" for s in _ARCHIVE_SUFFIXES}
    for path, name, sha in _archive_names(index, folder):
        if name not in plain | orig:
            continue
        try:
            with tarfile.open(path, "r:*") as outer:
                if _release_in(outer, library, version):
                    return {"archive": path, "archive_sha256": sha, "member": None, "member_sha256": None}
                for member in outer.getmembers():
                    if member.isfile() and os.path.basename(member.name) in plain:
                        data = outer.extractfile(member).read()
                        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as inner:
                            if _release_in(inner, library, version):
                                return {"archive": path, "archive_sha256": sha, "member": member.name,
                                        "member_sha256": hashlib.sha256(data).hexdigest()}
        except (tarfile.TarError, OSError, EOFError) as exc:
            log.warning("download_cache: %s: not a readable archive (%s)", path, exc)
    return None


def _release_in(archive: Any, library: str, version: str) -> bool:
    """Whether a tar archive holds ``<library>-<version>/`` (for FreeType: with that version in its
    ``include/freetype/freetype.h``)."""
    top = f"{library}-{version}/"
    names = [_member_name(m) for m in archive.getmembers()]
    if not any(n.startswith(top) for n in names):
        return False
    if library != "freetype":
        return True
    header = next((m for m in archive.getmembers() if _member_name(m) == top + "include/freetype/freetype.h"), None)
    if header is None:
        return False
    text = archive.extractfile(header).read().decode("latin-1")
    parts = [re.search(rf"#define\s+FREETYPE_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        return False
    found = [int(p.group(1)) for p in parts]
    want = [int(x) for x in version.split(".")] + [0] * (3 - len(version.split(".")))
    return found == want[:3]


def pre_extract_sources(tree: str, cache: str, where: str) -> list[dict[str, Any]]:
    """Before the install step: where the tree's build downloads a library's release and checks the
    download's sha256 (matplotlib's FreeType, :func:`freetype_wanted`), the cache does not hold that
    file, but holds the same release in another archive (:func:`find_release`), the release's
    sources are extracted into the folder the build uses when present (``build/freetype-<version>``;
    the build then skips the download). The bytes of that archive differ from the file the build
    checks; the sources are the same release's. What was extracted, from which archive (and its
    sha256), for the manifest."""
    import io

    wanted = freetype_wanted(tree)
    if wanted is None or os.path.exists(os.path.join(tree, wanted["into"])):
        return []
    if wanted["sha256"] and wanted["sha256"] in download_cache_index(cache)["sha256"]:
        return []  # the file itself: the build reads it from the seeded cache
    found = find_release(cache, wanted["library"], wanted["version"])
    if found is None:
        return []
    dest = os.path.join(tree, os.path.dirname(wanted["into"]))
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(found["archive"], "r:*") as outer:
        if found["member"] is None:
            _extract_release(outer, wanted["library"], wanted["version"], dest)
        else:
            data = outer.extractfile(found["member"]).read()
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as inner:
                _extract_release(inner, wanted["library"], wanted["version"], dest)
    log.info("%s: %s %s sources from %s into %s", where, wanted["library"], wanted["version"], found["archive"],
             wanted["into"])
    record = {k: v for k, v in wanted.items() if k != "sha256"}
    return [{**record, "wanted_sha256": wanted["sha256"], **found,
             "note": f"the same release as {wanted['file']}, from another archive: its bytes differ from the file "
                     "the build checks, its sources are that release's"}]


def _member_name(member: Any) -> str:
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name


def _extract_release(archive: Any, library: str, version: str, dest: str) -> None:
    """Extract ``<library>-<version>/`` of the archive into ``dest``: its files, folders and links
    only (tarfile's ``data`` filter: nothing outside ``dest``, no devices; a member that would leave
    ``dest`` is a PrepareError)."""
    top = f"{library}-{version}"
    members = []
    for member in archive.getmembers():
        name = _member_name(member)
        if name != top and not name.startswith(top + "/"):
            continue
        if os.path.isabs(name) or ".." in name.split("/") or member.isdev():
            raise PrepareError(f"download_cache: unsafe archive member {member.name!r} in the {library} release")
        members.append(member)
    if not hasattr(tarfile, "data_filter"):  # Python < 3.11.4: links checked here
        for member in members:
            if (member.issym() or member.islnk()) and (os.path.isabs(member.linkname) or ".." in member.linkname):
                raise PrepareError(f"download_cache: unsafe link {member.name!r} -> {member.linkname!r}")
    kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    archive.extractall(dest, members=members, **kwargs)


def install_instance(row: Mapping[str, Any], spec: Mapping[str, Any], env: Mapping[str, Any], repo_path: str,
                     config: PrepareConfig, where: str, progress: Progress | None = None) -> dict[str, Any]:
    """The row's work tree at ``base_commit`` and its own copy of the environment with the spec's
    ``pre_install`` and ``install`` run as the harness's setup script runs them (one bash script,
    ``set -euxo pipefail``, in the work tree, the environment first on ``PATH``; system package
    manager lines left out and recorded), so the tree holds what they edit and build (an install
    may also move dependencies, e.g. pylint's astroid range differs between commits of one
    version); the install's paths moved to the sandbox's work dir. Reused when stamped at the same
    commit on the same environment build. Output: ``envs_root/logs/<instance_id>.log``."""
    root = os.path.abspath(config.envs_root)
    dest, venv = os.path.join(root, "checkouts", row["instance_id"]), os.path.join(root, "envs", row["instance_id"])
    stamp = _read_stamp(dest)
    if (stamp is not None and stamp.get("base_commit") == row["base_commit"] and _read_stamp(venv) is not None
            and stamp.get("env_built_at") == env.get("built_at")):
        return {**stamp, "reused": True}
    start = time.monotonic()
    log_path = os.path.join(root, "logs", f"{row['instance_id']}.log")
    if os.path.exists(log_path):
        os.unlink(log_path)
    blobs = checkout(repo_path, row["base_commit"], dest, where, config.download_cache)
    try:  # the harness's image build cloned them (astropy 1.x-3.x's astropy_helpers): here they are supplied
        submodules = supply_submodules(repo_path, row["base_commit"], dest, repos_root=config.repos_root,
                                       cache=config.download_cache, keep=os.path.join(root, "submodules"))
    except (SubmoduleError, OSError, subprocess.SubprocessError) as exc:
        raise PrepareError(f"{where}: {exc}") from None
    copy_env(env["env_dir"], venv)
    record: dict[str, Any] = {"base_commit": row["base_commit"], "checkout": dest, "commands": [], "skipped": [],
                              "env_built_at": env.get("built_at"), "python": os.path.join(venv, "bin", "python"),
                              "log": log_path, "blobs_from_download_cache": blobs, "submodules": submodules}
    for command in [*_commands(spec.get("pre_install")), *_commands(spec.get("install"))]:
        (record["skipped"] if on_system(command) else record["commands"]).append(command)
    if record["commands"]:
        record["bounded_dependencies"] = _bounded_dependencies(dest, venv, spec.get("install"), config, where,
                                                               log_path, progress)
        if progress:
            progress(f"{where}: install step (log: {log_path})")
        # the harness's repository is /testbed: here it is the work tree
        script = "set -euxo pipefail\n" + "\n".join(c.replace("/testbed", dest) for c in record["commands"]) + "\n"
        seeded = None
        if config.download_cache:
            record["sources_from_download_cache"] = pre_extract_sources(dest, config.download_cache, where)
            seeded = seed_download_cache(config.download_cache, os.path.join(root, "download-cache"),
                                         [row["repo"].split("/")[-1]])
            record["download_cache"] = {"folder": os.path.abspath(config.download_cache), **seeded}
        _run(["bash", "-c", script], dest, venv, config.command_timeout_s, f"{where}: pre_install/install", log_path,
             progress, extra_env=seeded)
    record["tox_shims"] = tox_current_env_shims(dest, record["python"], spec.get("test_cmd"))
    record["relocated"] = relocate_install(venv, dest, config.workdir)
    record["generated_files"] = generated(dest)
    record["install_s"] = round(time.monotonic() - start, 1)
    _write_stamp(venv, {"from": env["env_dir"], "base_commit": row["base_commit"]})
    _write_stamp(dest, record)
    return {**record, "reused": False}


_PIP_INSTALL_SELF = re.compile(r"pip install\b.*?(?:^|\s)(?:-e\s+)?\.(\[[\w,.-]+\])?(?:\s|$)")


def _bounded_dependencies(tree: str, venv: str, install: str | Sequence[str] | None, config: PrepareConfig,
                          where: str, log_path: str, progress: Progress | None) -> bool:
    """Before the harness's ``pip install [-e] .[extras]``: install the project's dependencies as uv
    resolves them under :attr:`PrepareConfig.exclude_newer` (``uv pip compile`` reads the metadata
    only, nothing is built; the environment's installed versions are kept where the project allows
    them, as pip keeps them), so the install step finds them there instead of taking today's releases
    (pip has no date bound). True when done; False where it does not apply (no uv, no bound, an
    install command of another form, Python < 3.8)."""
    command = install if isinstance(install, str) or install is None else " ".join(install)
    match = _PIP_INSTALL_SELF.search(command or "")
    uv = _find_uv() if config.resolver != "pip" else None
    python = os.path.join(venv, "bin", "python")
    version = probe_python(python)
    if not (match and uv and config.exclude_newer and version and _minor(version[1]) >= 8):
        return False
    extras = [e for e in (match.group(1) or "").strip("[]").split(",") if e]
    source = next((f for f in ("pyproject.toml", "setup.cfg", "setup.py") if os.path.isfile(os.path.join(tree, f))
                   and (f != "pyproject.toml" or "[project]" in open(os.path.join(tree, f), encoding="utf-8").read())),
                  None)
    if source is None:
        return False
    out = os.path.join(venv, "requirements-bounded.txt")
    # what the environment holds goes in as the output's earlier pins, which uv keeps where the project
    # allows them: as pip's ``install -e .`` upgrades only what it must (xarray 0.12's numpy 1.23 stays,
    # not 2.0, which its scipy cannot import); a dependency the project needs moved still moves
    installed = subprocess.run([*uv, "pip", "freeze", "--python", python], capture_output=True, text=True, timeout=120)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write("".join(f"{line}\n" for line in installed.stdout.splitlines()
                         if re.fullmatch(r"[A-Za-z0-9_.\-]+==[^\s;@]+", line.strip())))
    try:  # reading a project's metadata may fail or build (numpy.distutils): then pip resolves alone
        _run([*uv, "pip", "compile", "--python", python, "--exclude-newer", config.exclude_newer, "--no-header",
              *[a for e in extras for a in ("--extra", e)], *_uv_args(config.pip_args), "-o", out, source], tree,
             venv, min(300.0, config.command_timeout_s),
             f"{where}: resolve the install step's dependencies (<= {config.exclude_newer})", log_path, progress)
    except PrepareError as exc:
        log.warning("%s (the install step resolves without the date bound)", str(exc).splitlines()[0])
        return False
    _run([*uv, "pip", "install", "--python", python, "--exclude-newer", config.exclude_newer,
          *_uv_args(config.pip_args), "-r", out], tree, venv, config.command_timeout_s,
         f"{where}: install them", log_path, progress)
    return True


def tox_current_env_shims(tree: str, python: str, test_cmd: str | Sequence[str] | None) -> list[str]:
    """For a ``tox --current-env -eNAME`` test command: ``.tox/NAME/bin/python{,3,3.X}`` in the work
    tree as scripts that run the row's venv ``python``. tox-current-env links them to
    ``sys.executable`` when they are missing; in the harness's conda env that is the env's real
    interpreter, but a venv's ``bin/python`` is itself a link to the base interpreter, and Python
    started through a link to that link finds no ``pyvenv.cfg`` and runs without the venv (``No
    module named pytest``). Existing files are left alone by tox-current-env, so these are used."""
    cmd = test_cmd if isinstance(test_cmd, str) or test_cmd is None else list(test_cmd)[-1]
    if not cmd or "tox" not in cmd.split() or "--current-env" not in cmd:
        return []
    names = re.findall(r"(?:^|\s)-e\s*([\w.-]+)", cmd) or ["py"]
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    made = []
    for name in names:
        bindir = os.path.join(tree, ".tox", name, "bin")
        os.makedirs(bindir, exist_ok=True)
        for suffix in ("", version.split(".")[0], version):
            path = os.path.join(bindir, f"python{suffix}")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(f"#!/bin/sh\nexec {shlex.quote(python)} \"$@\"\n")
            os.chmod(path, 0o755)
            made.append(os.path.relpath(path, tree))
    return made


def copy_env(source: str, dest: str) -> None:
    """A copy of the venv ``source`` at ``dest`` (links kept, the stamp left out), its scripts'
    ``#!`` lines and ``bin/`` files pointed at the copy."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(STAMP))
    for name in os.listdir(os.path.join(dest, "bin")):
        path = os.path.join(dest, "bin", name)
        if os.path.islink(path) or not os.path.isfile(path) or not _is_text(path, 1_000_000):
            continue
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if source in text:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text.replace(source, dest))


def _commands(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def relocate_install(env_dir: str, tree: str, workdir: str) -> list[str]:
    """Point what an install wrote into the venv at ``tree`` (editable ``.pth`` and finder files,
    ``egg-link``s, ``direct_url.json``) to ``workdir`` instead; the files changed."""
    changed = []
    for site in glob.glob(os.path.join(env_dir, "lib", "python*", "site-packages")):
        names = [n for n in os.listdir(site) if n.endswith((".pth", ".egg-link")) or n.startswith("__editable__")]
        names += [os.path.relpath(p, site) for p in glob.glob(os.path.join(site, "*.dist-info", "direct_url.json"))]
        for name in names:
            path = os.path.join(site, name)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            if tree not in text:
                continue
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text.replace(tree, workdir))
            changed.append(name)
        shutil.rmtree(os.path.join(site, "__pycache__"), ignore_errors=True)  # a finder's stale bytecode
    return sorted(changed)


def generated(tree: str, max_bytes: int = 1_000_000) -> list[str]:
    """Untracked text files of the work tree (ignored ones too) that the install step wrote."""
    listed = _git(tree, "ls-files", "-z", "--others", "--exclude-standard", "--ignored", "--directory", "--no-empty-directory")
    listed += _git(tree, "ls-files", "-z", "--others", "--exclude-standard")
    out = set()
    for rel in (p for p in listed.decode().split("\0") if p):
        for path in _walk(os.path.join(tree, rel)):
            name = os.path.relpath(path, tree)
            if not any(part in name or name.startswith(part) for part in GENERATED_SKIP) and _is_text(path, max_bytes):
                out.add(name)
    return sorted(out)


def _walk(path: str) -> list[str]:
    if os.path.isfile(path) and not os.path.islink(path):
        return [path]
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files if not os.path.islink(os.path.join(d, f))]


def _is_text(path: str, max_bytes: int) -> bool:
    if os.path.getsize(path) > max_bytes:
        return False
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return "\0" not in data.decode("utf-8")
    except UnicodeDecodeError:
        return False


# ===================================================================== rows -> specs.json
def test_command(test_cmd: str | Sequence[str] | None) -> str | None:
    """The loader's template for the harness's ``test_cmd``: the command itself, the test
    directives appended as the harness appends them (``tox --current-env -epy39 -v --``,
    ``./tests/runtests.py ...``, ``bin/test -C --verbose``, ``pytest -rA``); it runs with the row's
    environment first on ``PATH``. The last of a list is the test command (None: the loader's default)."""
    if not test_cmd:
        return None
    cmd = test_cmd if isinstance(test_cmd, str) else list(test_cmd)[-1]
    return cmd + " {test_files}"


def pre_test(eval_commands: Sequence[str] | None, locales: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """(commands the sandbox runs before the tests, notes): the harness's ``eval_commands`` that
    set the test's environment (``export NAME=...``); commands on the system (``locale-gen``, edits
    of ``/etc``) are left out and noted, and a locale this machine lacks (``en_US.UTF-8``) is
    replaced by ``C.UTF-8``, noted."""
    have = {x.lower().replace("-", "") for x in (locales if locales is not None else _locales())}
    kept, notes = [], []
    for command in eval_commands or ():
        if not re.match(r"^export [A-Za-z_][A-Za-z0-9_]*=", command.strip()):
            notes.append(f"left out (acts on the system): {command}")
            continue
        for loc in re.findall(r"([A-Za-z]{2}_[A-Z]{2}\.UTF-8)", command):
            if loc.lower().replace("-", "") not in have:
                command = command.replace(loc, "C.UTF-8")
                notes.append(f"{loc} is not installed here: C.UTF-8 instead")
        kept.append(command)
    return kept, notes


def _locales() -> list[str]:
    try:
        return subprocess.run(["locale", "-a"], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return []


COMPILED_SOURCES = (".pyx", ".pxd", ".pxi", ".c", ".cpp", ".cc", ".h", ".f", ".f90")


def not_gradable(row: Mapping[str, Any], spec: Mapping[str, Any], skipped: Sequence[str], tree: str) -> str | None:
    """Why the row cannot be graded here as the harness grades it, or None: a system package its
    image installs that this machine lacks; a gold patch to compiled sources of a tree whose install
    builds extensions (the harness runs the install step again after the patch; the sandbox's
    environment is read-only)."""
    for command in skipped:
        missing = [p for p in _apt_packages(command) if not _dpkg_installed(p)]
        if missing:
            return (f"needs its image: {command.strip()[:160]} (not installed here: {' '.join(missing)}; "
                    "apt-get install them on this machine, or prepare again with --install-system-packages)")
    built = _git(tree, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--", "*.so").strip(b"\0")
    touched = [p for p in re.findall(r"^diff --git a/.* b/(.*)$", row.get("patch", ""), flags=re.MULTILINE)
               if p.endswith(COMPILED_SOURCES)]
    if built and touched and spec.get("install"):
        return (f"the gold patch changes compiled sources ({', '.join(touched[:3])}); the harness runs the install "
                f"step (`{spec['install']}`) again after the patch to rebuild them, which the read-only "
                "environment of the sandbox cannot")
    return None


def _apt_packages(command: str) -> list[str]:
    out = []
    for part in re.split(r"&&|;|\|\|", command):
        words = part.split()
        if "install" in words and any(w.startswith("apt") for w in words):
            out += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return out


def _dpkg_installed(package: str) -> bool:
    try:
        res = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and "install ok installed" in res.stdout


def _row_where(where: str, row: Mapping[str, Any]) -> str:
    return f"{where}: {row.get('instance_id') or '<no instance_id>'}"


def _check_row(row: Mapping[str, Any], where: str, repos_root: str) -> str:
    """The row's repository path; a PrepareError naming the field at fault."""
    for key in ("instance_id", "repo", "base_commit", "version"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise PrepareError(f"{where}: {key}: missing or empty (a string is needed to prepare the environment)")
    repo_path = os.path.join(repos_root, row["repo"].replace("/", "__"))
    if not os.path.isdir(repo_path):
        raise PrepareError(f"{where}: repo: no git repository for {row['repo']} at {repo_path} "
                           "(clone it there with its full history)")
    if not is_commit(repo_path, row["base_commit"]):
        raise PrepareError(f"{where}: base_commit: {row['base_commit']} is not a commit of {repo_path} "
                           "(fetch the repository's full history)")
    return repo_path


def _select(located: list[tuple[str, dict[str, Any]]], ids: Sequence[str] | None, path: str) -> list[tuple[str, dict[str, Any]]]:
    if ids is None:
        return located
    chosen = [(w, r) for w, r in located if r.get("instance_id") in set(ids)]
    missing = sorted(set(ids) - {r.get("instance_id") for _, r in chosen})
    if missing:
        raise PrepareError(f"instance ids not in {path}: {missing}")
    return chosen


def prepare(rows_path: str, config: PrepareConfig, progress: Progress | None = None) -> PrepareReport:
    """Environments and work trees for the rows of ``rows_path`` (see the module docstring).
    A row whose environment or install fails is listed in ``failed`` with the reason; the others
    are prepared. ``manifest.json`` and ``specs.json`` are updated after every row, so an
    interrupted run keeps what it finished (and a rerun reuses it: stamped environments and work
    trees are not built again). ``progress`` receives one-line messages as steps start and run.
    Bad rows or a missing harness spec source raise :class:`PrepareError`."""
    located = _select(read_located_rows(rows_path), config.instance_ids, rows_path)
    harness = harness_specs(config.harness_python, config.harness_specs)
    os.makedirs(config.envs_root, exist_ok=True)
    report = PrepareReport(specs_path=os.path.join(config.envs_root, "specs.json"),
                           manifest_path=os.path.join(config.envs_root, "manifest.json"))
    named = [(_row_where(where, row), row) for where, row in located]
    checked = [(where, row, _check_row(row, where, config.repos_root)) for where, row in named]  # all, before building
    if config.install_system_packages:
        report.system_packages = install_system_packages_for(
            [env_spec(harness, row["repo"], row["version"], where) for where, row, _ in checked
             if row["version"] in harness["specs"].get(row["repo"], {})], progress)
    envs: dict[str, dict[str, Any] | PrepareError] = {}
    for number, (where, row, repo_path) in enumerate(checked, start=1):
        if progress:
            progress(f"[{number}/{len(checked)}] {row['instance_id']}")
        try:
            spec = env_spec(harness, row["repo"], row["version"], where)
            key = env_key(row["repo"], row["version"])
            if key not in envs:
                envs[key] = _env_or_error(row, spec, harness, repo_path, config, where, progress)
            env = envs[key]
            if isinstance(env, PrepareError):
                raise PrepareError(f"{where}: the environment {key} failed: {env}")
            inst = install_instance(row, spec, env, repo_path, config, where, progress)
        except PrepareError as exc:
            log.error("%s", exc)
            report.failed[row["instance_id"]] = str(exc)
            _write_outputs(report)
            continue
        report.prepared[row["instance_id"]] = _instance_record(row, spec, env, inst)
        _write_outputs(report)
    _write_outputs(report)
    return report


def system_packages_wanted(specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The packages the specs' ``pre_install`` lines install with the system's package manager, in order."""
    out: list[str] = []
    for spec in specs:
        for command in _commands(spec.get("pre_install")):
            if on_system(command):
                out += [p for p in _apt_packages(command) if p not in out]
    return out


def install_system_packages_for(specs: Sequence[Mapping[str, Any]], progress: Progress | None = None) -> dict[str, Any]:
    """``apt-get install`` what :func:`system_packages_wanted` names and this machine lacks, where
    apt has it (:mod:`compactrl.tasksets.system_packages`: root only, each command printed and recorded
    in ``~/.cache/compactrl/system-packages.jsonl``); ``{"wanted", "installed", "unavailable"}``.
    A failing apt is a PrepareError with apt's last lines."""
    from compactrl.tasksets.system_packages import (
        SYSTEM_PACKAGES_RECORD,
        apt_decision,
        install_system_packages,
    )

    wanted = system_packages_wanted(specs)
    decision = apt_decision([p for p in wanted if not _dpkg_installed(p)])
    todo = [p for p, d in decision.items() if d == "installable"]
    unavailable = [p for p, d in decision.items() if d == "unavailable"]
    echo = progress or (lambda message: log.info("%s", message))
    if unavailable:
        echo(f"system packages apt has no candidate for (their rows stay not gradable): {' '.join(unavailable)}")
    try:
        installed = install_system_packages(todo, SYSTEM_PACKAGES_RECORD, echo) if todo else []
    except RuntimeError as exc:
        raise PrepareError(f"install_system_packages: {exc}") from None
    return {"wanted": wanted, "installed": installed, "unavailable": unavailable, "record": SYSTEM_PACKAGES_RECORD,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _env_or_error(row, spec, harness, repo_path, config, where, progress=None) -> dict[str, Any] | PrepareError:
    try:
        return build_env(row, spec, harness, repo_path, config, where, progress)
    except PrepareError as exc:
        return exc


def _instance_record(row: Mapping[str, Any], spec: Mapping[str, Any], env: Mapping[str, Any],
                     inst: Mapping[str, Any]) -> dict[str, Any]:
    kept, notes = pre_test(spec.get("eval_commands"))
    return {"repo": row["repo"], "version": row["version"], "env": env_key(row["repo"], row["version"]),
            "python": inst["python"], "python_requested": env["python_requested"],
            "python_version": env["python_version"], "python_fallback": env["python_requested"] != env["python_version"],
            "test_command": test_command(spec.get("test_cmd")), "pre_test": kept, "pre_test_notes": notes,
            "env_commands": env["commands"], "env_skipped_packages": env.get("skipped_packages", []),
            "env_build_tool_caps": env.get("build_tool_caps", []), "env_exclude_newer": env.get("exclude_newer"),
            "env_log": env.get("log"), "env_build_s": env.get("build_s"), "env_reused": env["reused"],
            "not_gradable": not_gradable(row, spec, inst["skipped"], inst["checkout"]),
            **{k: inst[k] for k in ("checkout", "commands", "skipped", "relocated", "generated_files", "install_s",
                                    "reused")}, "log": inst.get("log"),
            "blobs_from_download_cache": inst.get("blobs_from_download_cache", []),
            "sources_from_download_cache": inst.get("sources_from_download_cache", []),
            "submodules": inst.get("submodules", []), "download_cache": inst.get("download_cache")}


def specs_entries(prepared: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``--swebench-specs`` entries: per ``owner/name@version`` the test command, per instance its
    venv's python, its work tree and generated files."""
    out: dict[str, dict[str, Any]] = {}
    for iid, rec in prepared.items():
        if rec.get("test_command"):
            out[f"{rec['repo']}@{rec['version']}"] = {"test_command": rec["test_command"]}
        out[iid] = {"python": rec["python"], "checkout": rec["checkout"], "generated_files": list(rec["generated_files"])}
        if rec.get("pre_test"):
            out[iid]["pre_test"] = list(rec["pre_test"])
        if rec.get("not_gradable"):
            out[iid]["not_gradable"] = rec["not_gradable"]
    return out


def _write_outputs(report: PrepareReport) -> None:
    """Merge into the existing ``specs.json`` and ``manifest.json`` (earlier runs' instances stay)."""
    manifest = _load_json(report.manifest_path) or {"instances": {}, "failed": {}}
    manifest["instances"].update(report.prepared)
    for iid in report.prepared:
        manifest["failed"].pop(iid, None)
    manifest["failed"].update(report.failed)
    if report.system_packages:
        manifest.setdefault("system_packages", []).append(report.system_packages)
        report.system_packages = {}  # recorded once
    for iid in report.failed:
        manifest["instances"].pop(iid, None)
    _write_json(report.manifest_path, manifest)
    specs = specs_entries(manifest["instances"])
    for iid, why in manifest["failed"].items():  # flagged, so validate and eval name it instead of running it
        specs[iid] = {"not_gradable": f"not prepared: {_failure_line(why)}"}
    _write_json(report.specs_path, specs)


def _failure_line(why: str) -> str:
    """A prepare failure in one line: its first line, and the line of its log that names the error."""
    lines = [x.strip() for x in why.strip().splitlines() if x.strip()]
    key = next((x for x in lines[1:] if re.search(r"unable|error:|cannot|Errors?\.|Failed", x)), None)
    return (lines[0][:300] + (f" ... {key[:240]}" if key else "")) if lines else why


def _load_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def _write_json(path: str, value: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
