"""A Terminal-Bench task's file state built from its Dockerfile on the local backend.

:func:`plan` reads the last stage's steps (``WORKDIR``, ``ENV``, ``COPY``/``ADD``, ``RUN``) before any
episode and decides, per ``RUN``, what the local sandbox can do:

* package-manager commands are mapped to what this machine has: ``apt-get install`` of packages that
  are installed here (``dpkg-query``) is already done; ``pip install`` (``pip3``, ``python -m pip``,
  ``uv pip``) of requirements the sandbox's Python satisfies is already done, others are installed
  at prepare time from the package index into the task's own ``site`` folder (on ``PYTHONPATH``
  inside); ``apt-get update``, ``chown``, ``useradd`` and the like are no-ops here;
* what cannot be mapped (a package this machine lacks, ``curl``/``wget``/``git clone``, ``npm``,
  ``cargo install``, ``go install``, ``uvx``, a ``pip install`` of a local project, ``COPY --from``,
  ``ADD`` of a URL...) makes the task ``metadata["not_gradable"] = "needs its image: <the step>"``;
* every other command runs, in order, inside a local sandbox (``/bin/sh -c``, as the engine runs
  ``RUN``), with the ``ENV`` seen so far and the current ``WORKDIR``; ``COPY`` outside the work dir
  is staged and copied there.

:func:`prepare` runs the plan once per (task, Dockerfile and context, interpreter) and keeps the
result under ``<cache>/<task id>-<key>/``: ``work/`` (the work dir, with modes), ``roots.tar`` (what
the steps wrote outside the work dir: ``/root``, ``/opt``, ``/data``...), ``site/`` (pip's target)
and ``state.json``. A step that fails there makes the task not gradable with the step, its exit
code and its output's tail. The local sandbox restores ``work/`` and ``roots.tar`` at the start of
every episode (``metadata["local_state"]``); nothing is downloaded during an episode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

STAGE_DIR = ".compactrl_stage"
ROOTS_TAR = ".compactrl_roots.tar"
# What a prepared state keeps from outside the work dir (the local sandbox's private writable folders,
# less those the grader needs empty: /tests, /logs, /solution).
KEEP_ROOTS = ("/root", "/home", "/opt", "/srv", "/mnt", "/var/tmp", "/var/log", "/output", "/data")
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "compactrl", "tb-local")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_APT = {"apt-get", "apt", "aptitude"}
_PIP = re.compile(r"^pip(3(\.\d+)?)?$")
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
# commands that fetch from the network or install outside what the machine has: only the image has them
_IMAGE_ONLY = {"curl", "wget", "npm", "npx", "yarn", "pnpm", "gem", "bundle", "conda", "mamba", "micromamba", "apk",
               "yum", "dnf", "microdnf", "zypper", "pipx", "uvx", "rustup", "nvm", "sdk", "add-apt-repository",
               "service", "systemctl", "snap", "brew", "dpkg", "update-alternatives", "locale-gen", "poetry",
               "pdm", "hatch", "conan", "vcpkg", "bun", "deno", "mvn", "gradle", "sbt", "dotnet", "composer",
               "cpan", "cpanm", "R", "Rscript", "julia", "opam", "cabal", "stack", "nix", "git-lfs", "docker",
               "podman", "mysql", "psql", "redis-server", "mongod", "nginx"}
_NOOP = {"chown", "useradd", "adduser", "groupadd", "addgroup", "usermod", "passwd", "chgrp", "ldconfig",
         "update-ca-certificates"}
_GIT_NETWORK = {"clone", "fetch", "pull", "submodule", "ls-remote"}
_CARGO_NETWORK = {"install", "fetch", "update", "add", "search", "publish"}
_GO_NETWORK = {"install", "get", "mod"}
_SEPARATORS = ("&&", "||", ";", "|", "\n", "&")


@dataclass
class Segment:
    text: str
    words: list[str]
    action: str  # "run" | "noop" | "apt" | "pip" | "image"
    detail: Any = None


def split_segments(command: str) -> list[tuple[str, str]]:
    """``[(segment text, separator after it)]`` of a shell command line, split at ``&&``, ``||``,
    ``;``, ``|``, ``&`` and newlines outside quotes (subshells and ``$( )`` are kept whole)."""
    out, start, i, quote, depth = [], 0, 0, "", 0
    while i < len(command):
        c = command[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c == "\\":
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            sep = next((s for s in _SEPARATORS if command.startswith(s, i)), None)
            if sep:
                out.append((command[start:i], sep))
                i += len(sep)
                start = i
                continue
        i += 1
    out.append((command[start:], ""))
    return out


def _words(text: str) -> list[str]:
    try:
        words = shlex.split(text, comments=False)
    except ValueError:
        words = text.split()
    while words and (re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]) or words[0] in ("sudo", "exec", "command", "nohup",
                                                                               "time", "env")):
        words = words[1:]
        while words and words[0].startswith("-") and len(words) > 1:  # sudo -E / env -i
            words = words[1:]
    return words


def _pip_requirements(words: list[str], files: dict[str, str], context: str) -> tuple[list[str] | None, str]:
    """Requirements of a ``pip install`` argument list; None and why for what cannot be mapped."""
    reqs, i = [], 0
    takes_value = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "-f", "--find-links",
                   "--target", "-t", "--prefix", "--root", "--platform", "--python-version", "--implementation",
                   "--abi", "--trusted-host", "--cache-dir", "--src", "--progress-bar", "--timeout", "--retries",
                   "--python", "-p", "--index-strategy", "--upgrade-strategy", "--only-binary", "--no-binary"}
    while i < len(words):
        w = words[i]
        if w in ("-r", "--requirement"):
            if i + 1 >= len(words):
                return None, "pip install -r without a file"
            text = _context_text(words[i + 1], files, context)
            if text is None:
                return None, f"pip install -r {words[i + 1]}: the file is not in the build context"
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line and not line.startswith("-"):
                    reqs.append(line)
                elif line.startswith("-e") or line.startswith("-r"):
                    return None, f"pip install -r {words[i + 1]}: nested {line.split()[0]}"
            i += 2
            continue
        if w in ("-e", "--editable") or (not w.startswith("-") and (w.startswith((".", "/")) or "/" in w
                                                                       and "://" not in w and "@" not in w)):
            return None, f"pip install of a local project ({w})"
        if w.startswith("-"):
            i += 2 if w in takes_value else 1
            continue
        if "://" in w or w.startswith("git+"):
            return None, f"pip install from a URL ({w})"
        reqs.append(w)
        i += 1
    return reqs, ""


def _context_text(path: str, files: dict[str, str], context: str) -> str | None:
    rel = path.lstrip("./")
    for cand in (rel, path):
        if cand in files:
            return files[cand]
    full = os.path.join(context, rel)
    if os.path.isfile(full):
        with open(full, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    return None


def classify(text: str, files: dict[str, str], context: str) -> Segment:
    words = _words(text)
    if not words:
        return Segment(text, words, "run")
    cmd, rest = os.path.basename(words[0]), words[1:]
    sub = next((w for w in rest if not w.startswith("-")), "")
    if cmd in _APT:
        if sub != "install":
            return Segment(text, words, "noop")
        pkgs = [re.split(r"[=:]", w)[0] for w in rest[rest.index("install") + 1:] if not w.startswith("-")]
        return Segment(text, words, "apt", pkgs)
    pip_args = None
    if _PIP.match(cmd):
        pip_args = rest
    elif _PYTHON.match(cmd) and rest[:2] == ["-m", "pip"]:
        pip_args = rest[2:]
    elif cmd == "uv" and rest[:1] == ["pip"]:
        pip_args = rest[1:]
    if pip_args is not None:
        first = next((w for w in pip_args if not w.startswith("-")), "")
        if first != "install":
            return Segment(text, words, "noop")
        reqs, why = _pip_requirements(pip_args[pip_args.index("install") + 1:], files, context)
        return Segment(text, words, "pip", reqs) if reqs is not None else Segment(text, words, "image", why)
    if cmd == "uv":
        return Segment(text, words, "image", f"uv {sub} (a project environment from the network)")
    if cmd in _IMAGE_ONLY or (cmd == "git" and sub in _GIT_NETWORK) or (cmd == "cargo" and sub in _CARGO_NETWORK) \
            or (cmd == "go" and sub in _GO_NETWORK):
        return Segment(text, words, "image", f"{cmd} {sub}".strip())
    targets = [w for w in rest if not w.startswith("-")]
    if cmd in ("bash", "sh") and targets and targets[0].endswith(".sh"):
        # a build script from the context: what it runs counts as the step's (its exit status may hide a
        # failed download, e.g. a `git clone` followed by more commands)
        script = _context_text(targets[0].replace("/app/", "", 1) if targets[0].startswith("/") else targets[0],
                               files, context) or _context_text(os.path.basename(targets[0]), files, context)
        for line in (script or "").splitlines():
            for inner, _sep in split_segments(line.split("#", 1)[0] if line.lstrip().startswith("#") else line):
                seg = classify(inner, files, context)
                if seg.action == "image":
                    return Segment(text, words, "image", f"{os.path.basename(targets[0])} runs {seg.detail}")
    if cmd in _NOOP or (cmd == "rm" and _system_paths(targets)):
        return Segment(text, words, "noop")
    if cmd == "rm" and any(t.startswith("/") and t.strip("/").split("/")[0] in _NOT_TASK_ROOTS
                           and not t.startswith(("/tmp/", "/var/tmp/", "/var/log/")) for t in targets):
        # `rm -rf` of a system file that this machine lacks "succeeds" and changes nothing here
        return Segment(text, words, "image", "removes system files: the effect exists only in the image")
    return Segment(text, words, "run")


_CACHES = ("/var/lib/apt/lists", "/var/cache/apt", "/var/cache/debconf", "/var/cache/apk", "/root/.cache/pip")


def _system_paths(paths: list[str]) -> bool:
    """Only a package manager's caches (an image-size clean-up that changes no file a task uses). Any
    other removal outside the writable folders (``rm -rf .../site-packages/pip`` to break an image on
    purpose) is run, fails on the read-only root, and so makes the task not gradable."""
    return bool(paths) and all(p.startswith(_CACHES) for p in paths)


# Top-level folders of the image that are the system's (read-only here) or the sandbox's own.
_NOT_TASK_ROOTS = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "tmp", "sys", "run",
                   "var", "boot", "", ".", ".."}
_ABS_PATH = re.compile(r"(?<![\w.$/~-])/([A-Za-z0-9_][A-Za-z0-9_.-]*)")


def task_roots(steps: list[dict], workdir: str | None) -> list[str]:
    """Top-level folders outside the system ones that the Dockerfile's steps create or fill
    (``/protected``, ``/app`` above a ``/app/site`` work dir): the local sandbox makes each a private
    writable folder, and a prepared state keeps what the steps put there."""
    found = set()
    for step in steps:
        texts = [step.get("command", ""), step.get("path", "")] + [p[1] for p in step.get("pairs", [])]
        for text in texts:
            found.update(m.group(1) for m in _ABS_PATH.finditer(text or ""))
    if workdir:
        found.add(workdir.strip("/").split("/")[0])
    return sorted("/" + f for f in found if f not in _NOT_TASK_ROOTS and "/" + f != workdir)


# Interactive terminal tools that images install for the agent's session (the harness records it with
# asciinema inside tmux); no grader uses them, so their absence here changes no verdict.
SESSION_TOOLS = {"asciinema", "tmux", "nano", "vim", "vim-tiny", "less", "screen", "htop", "man-db", "emacs-nox"}


def _host_has_package(name: str) -> bool:
    """Installed here: by dpkg, or as a command of that name on PATH or in the toolchains the local
    sandbox mounts (``npm`` with Node's own install, ``rustc`` through rustup)."""
    from compactrl.envs.sandbox.local import host_toolchains

    if shutil.which(name, path=":".join([BASE_PATH, *host_toolchains()[1]])):
        return True
    try:
        res = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", name], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and res.stdout.strip() == "installed"


def _satisfied(requirement: str) -> bool:
    """True when the interpreter running compactrl (the sandbox's default) already satisfies it."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return False
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return False
    return not req.specifier or req.specifier.contains(version, prereleases=True)


@dataclass
class Plan:
    """What the local backend does for one task's Dockerfile (JSON in ``metadata["local_build"]``)."""

    key: str
    steps: list[dict] = field(default_factory=list)
    """``{"op": "run", "command", "workdir", "env"}`` (package segments replaced) or ``{"op": "copy_out",
    "pairs"}`` (staged files to copy outside the work dir), in build order."""
    pip: list[str] = field(default_factory=list)
    """Requirements to install into the task's ``site`` folder at prepare time."""
    env: dict[str, str] = field(default_factory=dict)
    """The image's ``ENV`` after the last step, expanded."""
    mapped: list[str] = field(default_factory=list)
    """One line per package step mapped to this machine (for the task's notes)."""
    roots: list[str] = field(default_factory=list)
    """Top-level folders the steps use outside the system ones (:func:`task_roots`)."""

    def to_json(self) -> dict:
        return {"key": self.key, "steps": self.steps, "pip": self.pip, "env": self.env, "mapped": self.mapped,
                "roots": self.roots}


def _expand(value: str, env: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced as the engine expands ENV values."""
    def sub(m: re.Match) -> str:
        got = env.get(m.group(1) or m.group(3), "")
        return got if got or m.group(2) is None else m.group(2)
    return re.sub(r"\$(?:\{(\w+)(?::?-([^}]*))?\}|(\w+))", sub, value)


def solution_requirements(script: str | None) -> list[str]:
    """What a script ``pip install``s or runs ``uvx --with`` (a reference solution, a test script: the
    harness's containers have the network, the local sandbox has none): those requirements are
    installed at prepare time instead."""
    reqs: list[str] = []
    for line in (script or "").splitlines():
        for text, _sep in split_segments(line):
            seg = classify(text, {}, "")
            found = seg.detail if seg.action == "pip" else []
            if seg.words and os.path.basename(seg.words[0]) in ("uvx", "uv"):  # uvx --with numpy==2.1.3 pytest ...
                found = [seg.words[i + 1] for i, w in enumerate(seg.words[:-1]) if w in ("--with", "-w")]
            reqs += [r for r in found if r not in reqs]
    return reqs


_FETCHERS = {"curl", "wget", "git", "uv", "uvx", "npm", "npx", "yarn", "pnpm", "cargo", "go", "gem", "conda", "pipx",
             "apk", "yum", "dnf", "rustup", "bun", "deno"}


def solution_network(script: str | None) -> str | None:
    """What in a reference solution fetches from the network (``curl ... | sh``, ``uv add flask``,
    ``git clone``), or None. The harness's agent has the network; the local sandbox has none."""
    for line in (script or "").splitlines():
        if line.lstrip().startswith("#"):
            continue
        for text, _sep in split_segments(line):
            seg = classify(text, {}, "")
            local = re.search(r"(//|@|^|\s)(localhost|127\.0\.0\.1|0\.0\.0\.0)\b", " ".join(seg.words[1:]))
            if seg.action == "image" and seg.words and os.path.basename(seg.words[0]) in _FETCHERS and not local:
                return str(seg.detail)
            if seg.action == "apt":
                missing = [p for p in seg.detail if p not in SESSION_TOOLS and not _host_has_package(p)]
                if missing:
                    return f"apt-get install {' '.join(missing)}, which this machine lacks"
    return None


def plan(steps: list[dict], files: dict[str, str], context: str, workdir: str | None,
         digest: str, solution_pip: list[str] | tuple[str, ...] = ()) -> tuple[Plan | None, str | None]:
    """``(plan, None)``, ``(None, None)`` when nothing needs replaying, or ``(None, "needs its image: ...")``."""
    env: dict[str, str] = {"PATH": BASE_PATH, "HOME": "/root"}
    out = Plan(key=digest)
    todo = [r for r in solution_pip if not _satisfied(r)]
    if todo:
        out.pip += todo
        out.mapped.append(f"what the solution or the test script installs ({' '.join(todo)}): into the task's site "
                          "folder at prepare time (the sandbox has no network)")
    root = (workdir or "").rstrip("/") + "/"
    for step in steps:
        op = step["op"]
        if op == "other":
            return None, f"needs its image: {step['text'][:160]}"
        if op == "env":
            for name, value in step["vars"].items():
                env[name] = _expand(value, env)
        elif op == "copy":
            outside = [p for p in step["pairs"] if not (workdir and p[1].startswith(root))]
            if outside:
                inline = {d: c for d, c in (step.get("inline") or {}).items() if any(d == p[1] for p in outside)}
                out.steps.append({"op": "copy_out", "pairs": outside, **({"inline": inline} if inline else {})})
        elif op == "run":
            pieces, why = [], None
            for text, sep in split_segments(step["command"]):
                seg = classify(text, files, context)
                if seg.action == "image":
                    why = f"needs its image: RUN {step['command'].strip()[:160]} ({seg.detail})"
                    break
                if seg.action == "apt":
                    missing = [p for p in seg.detail if p not in SESSION_TOOLS and not _host_has_package(p)]
                    if missing:
                        why = (f"needs its image: RUN {step['command'].strip()[:160]} (apt packages not installed on "
                               f"this machine: {' '.join(missing)})")
                        break
                    absent = [p for p in seg.detail if p in SESSION_TOOLS and not _host_has_package(p)]
                    out.mapped.append(f"apt-get install {' '.join(seg.detail)}: installed on this machine" + (
                        f" except {' '.join(absent)} (terminal session tools, used by no grader)" if absent else ""))
                    text = " true "
                elif seg.action == "pip":
                    todo = [r for r in seg.detail if not _satisfied(r)]
                    out.pip += [r for r in todo if r not in out.pip]
                    out.mapped.append(f"pip install {' '.join(seg.detail)}: " + (
                        f"{' '.join(todo)} into the task's site folder at prepare time" if todo
                        else "satisfied by the sandbox's Python"))
                    text = " true "
                elif seg.action == "noop":
                    text = " true "
                pieces.append(text + sep)
            if why:
                return None, why
            out.steps.append({"op": "run", "command": "".join(pieces), "workdir": step.get("workdir") or "/",
                              "env": dict(env)})
    if out.pip:
        env["PYTHONPATH"] = ":".join(filter(None, ["__SITE__", env.get("PYTHONPATH", "")]))
        # the image's pytest loads the plugins installed with it (e.g. pytest-json-ctrf for --ctrf)
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = ""
    out.env = {k: v for k, v in env.items() if k != "HOME"}
    out.roots = task_roots(steps, workdir)
    needed = any(s["op"] in ("run", "copy_out") for s in out.steps) or out.pip or len(out.env) > 1
    return (out if needed else None), None


def digest_of(dockerfile: str, context: str, extra: str = "") -> str:
    """SHA-256 (16 hex) over the Dockerfile, every context file (path, mode, bytes) and ``extra``."""
    h = hashlib.sha256()
    with open(dockerfile, "rb") as fh:
        h.update(fh.read())
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
                h.update(f"{os.path.relpath(path, context)}\0{st.st_mode & 0o777}\0{st.st_size}\0".encode())
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
            except OSError:
                continue
    h.update(extra.encode())
    return h.hexdigest()[:16]


class PrepareError(RuntimeError):
    """A Dockerfile step failed locally; the message is the task's not_gradable reason."""


STATE_VERSION = 3
"""Bumped when how a state is built changes, so no state (nor a failure) of an older build is reused."""


def state_dir(task_id: str, build: dict, cache: str | None = None) -> str:
    """``<cache>/<task id>-<key>``: the key covers the Dockerfile, the context, the interpreter and the plan."""
    plan_digest = hashlib.sha256(json.dumps([STATE_VERSION, build], sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join(cache or os.environ.get("COMPACTRL_TB_LOCAL_CACHE") or DEFAULT_CACHE,
                        f"{task_id}-{build['key']}{plan_digest}")


def with_local_state(task, cache: str | None = None):
    """``task`` with its prepared state (``metadata["local_state"]``): from the cache, or built now
    without downloads (a task that needs packages fetched must be prepared before its episode: the
    loader with ``prepare=True``, or ``compactrl tasks validate``). A state that cannot be prepared is a
    :class:`~compactrl.envs.sandbox.SandboxError` naming the task, as any infrastructure failure."""
    import dataclasses

    from compactrl.envs.sandbox.base import SandboxError

    try:
        state = prepare(task, cache, allow_download=False)
    except PrepareError as e:
        raise SandboxError(f"task {task.id}: {e}") from None
    return dataclasses.replace(task, metadata={**task.metadata, "local_state": state})


def prepare(task, cache: str | None = None, *, allow_download: bool = True, timeout_s: float = 900.0,
            sandbox_options: dict | None = None) -> str:
    """The task's prepared state folder (built now if absent). Raises :class:`PrepareError`."""
    entry = task.metadata["local_build"]
    if entry.get("error"):
        raise PrepareError(entry["error"])
    build = entry["build"]
    dest = state_dir(task.id, build, cache)
    done = os.path.join(dest, "state.json")
    if os.path.isfile(done):
        with open(done) as fh:
            state = json.load(fh)
        if state.get("error"):
            raise PrepareError(state["error"])
        return dest
    if build.get("pip") and not allow_download:
        raise PrepareError(f"needs preparing: pip install {' '.join(build['pip'])} (run the loader with "
                           "prepare=True, or `compactrl tasks validate`, before the episode)")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{task.id}-", dir=os.path.dirname(dest))
    os.chmod(tmp, 0o755)  # the sandbox's unprivileged user reads it (roots.tar, site/)
    started = time.monotonic()
    try:
        error = _build(task, build, tmp, timeout_s, sandbox_options or {})
        with open(os.path.join(tmp, "state.json"), "w") as fh:
            json.dump({"task": task.id, "key": build["key"], "error": error,
                       "seconds": round(time.monotonic() - started, 1), "python": sys.executable}, fh)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if error:
        raise PrepareError(error)
    return dest


def _build(task, build: dict, out: str, timeout_s: float, options: dict) -> str | None:
    """Run the plan into ``out`` (``work/``, ``roots.tar``, ``site/``); the failure reason or None."""
    from compactrl.envs.sandbox.local import LocalSandbox
    from compactrl.envs.task import Check, Task

    site = os.path.join(out, "site")
    if build.get("pip"):
        os.makedirs(site)
        # wheels only: a requirement with none for this interpreter (numpy 1.21 on Python 3.11) is the
        # image's, not something to compile here for half an hour
        cmd = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet",
               "--only-binary=:all:", "--target", site, *build["pip"]]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"needs its image: pip install {' '.join(build['pip'])} (timed out after {timeout_s:g}s)"
        if res.returncode != 0:
            tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
            return f"needs its image: pip install {' '.join(build['pip'])} (pip failed here: {' | '.join(tail)[-300:]})"
    outs = [(src, dest, (s.get("inline") or {}).get(dest)) for s in build["steps"] if s["op"] == "copy_out"
            for src, dest in s["pairs"]]
    stage = {f"{STAGE_DIR}/{i}": inline if inline is not None else _read_context(task, src)
             for i, (src, _dest, inline) in enumerate(outs)}
    files = {**task.files, **{k: v for k, v in stage.items() if v is not None}}
    meta = {k: task.metadata[k] for k in ("workdir", "writable_paths") if k in task.metadata}
    meta["writable_paths"] = sorted({*meta.get("writable_paths", ()), *build.get("roots", ())})
    box = Task(id=task.id, kind="terminal", instruction="prepare", files=files, check=Check(kind="script", command="true"),
               metadata=meta | {"env": _site_env(build.get("env") or {}, site)})
    sandbox = LocalSandbox(**({"file_size_bytes": 16 << 30, "writable_bytes": 4 << 30, "timeout_s": timeout_s,
                               "output_limit_bytes": 16 << 20,
                               "ro_binds": (out,)} | options))
    sandbox.start(box)
    try:
        index = 0
        for step in build["steps"]:
            if step["op"] == "copy_out":
                for _src, dest in step["pairs"]:
                    q = shlex.quote(dest)
                    staged = shlex.quote(f"{sandbox._workdir}/{STAGE_DIR}/{index}")
                    res = sandbox.exec(f"mkdir -p \"$(dirname {q})\" && cp {staged} {q}")
                    index += 1
                    if res.exit_code != 0:
                        return f"needs its image: COPY to {dest} (cannot be written here: {res.output.strip()[-200:]})"
                continue
            env = _site_env(step["env"], site)
            exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items() if k != "PATH")
            path = env.get("PATH", BASE_PATH)
            command = (f"{exports}export PATH={shlex.quote('/opt/compactrl/bin:' + path)}; "
                       f"mkdir -p {shlex.quote(step['workdir'])} 2>/dev/null; cd {shlex.quote(step['workdir'])} && "
                       f"/bin/sh -c {shlex.quote(step['command'])}")
            res = sandbox.exec(command, timeout_s=timeout_s)
            if res.exit_code != 0:
                tail = " | ".join(res.output.strip().splitlines()[-3:])[-300:]
                what = "timed out" if res.timed_out else f"exit {res.exit_code}"
                return f"needs its image: RUN {step['command'].strip()[:160]} (failed here: {what}: {tail})"
        _archive_roots(sandbox, timeout_s, [r for r in build.get("roots", ()) if r not in ("/tests", "/logs", "/solution")])
        work = os.path.join(sandbox.session_dir, "work")
        tar = os.path.join(work, ROOTS_TAR)
        if os.path.isfile(tar) and os.path.getsize(tar) > 0:
            shutil.move(tar, os.path.join(out, "roots.tar"))
        elif os.path.exists(tar):
            os.remove(tar)
        shutil.copytree(work, os.path.join(out, "work"), symlinks=True)
    finally:
        sandbox.close()
    return None


def _archive_roots(sandbox, timeout_s: float, extra_roots: list[str]) -> None:
    """What the steps wrote outside the work dir, as ``ROOTS_TAR`` in the work dir: every entry under
    :data:`KEEP_ROOTS` except the sandbox's own mounts (toolchains, the interpreter, this state) and
    the folders leading to them."""
    work = sandbox._workdir
    roots = sorted({*KEEP_ROOTS, *extra_roots})
    listing = sandbox.exec(f"cd / && rm -rf {shlex.quote(work)}/{STAGE_DIR}; awk '{{print $5}}' /proc/self/mountinfo;"
                           " echo __compactrl_entries__; for d in " + " ".join(shlex.quote(p[1:]) for p in roots)
                           + '; do [ -d "$d" ] && find "$d" -mindepth 1 -xdev; done; true', timeout_s=timeout_s)
    mounts_text, _, entries_text = listing.output.partition("__compactrl_entries__\n")
    mounts = {m.strip("/") for m in mounts_text.split() if m.startswith("/")} - {p.strip("/") for p in roots}
    blocked = {"/".join(m.split("/")[:k]) for m in mounts for k in range(1, m.count("/") + 2)}
    entries = [e for e in entries_text.splitlines() if e and e not in blocked
               and not any(e.startswith(m + "/") for m in mounts)]
    if not entries:
        return
    sandbox.write_file(f"{STAGE_DIR}.list", "\n".join(entries) + "\n")
    res = sandbox.exec(f"cd / && tar -cf {shlex.quote(work)}/{ROOTS_TAR} --no-recursion -T {shlex.quote(work)}/"
                       f"{STAGE_DIR}.list 2>&1; rm -f {shlex.quote(work)}/{STAGE_DIR}.list", timeout_s=timeout_s)
    if res.exit_code != 0:
        raise PrepareError(f"archiving what the Dockerfile's steps wrote outside the work dir failed: {res.output[-300:]}")


def _site_env(env: dict[str, str], site: str) -> dict[str, str]:
    return {k: v.replace("__SITE__", site) for k, v in env.items()}


def _read_context(task, src: str) -> str | None:
    build = task.metadata.get("image_build") or {}
    path = os.path.join(build.get("context", ""), src)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="surrogateescape")
