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
  ``ADD`` of a URL...) makes the task's ``grading.not_gradable`` "needs its image: <the step>";
* every other command runs, in order, inside a local sandbox (``/bin/sh -c``, as the engine runs
  ``RUN``), with the ``ENV`` seen so far and the current ``WORKDIR``; ``COPY`` outside the work dir
  is staged and copied there.

:func:`prepare` runs the plan once per (task, Dockerfile and context, interpreter) and keeps the
result under ``<cache>/<task id>-<key>/``: ``work/`` (the work dir, with modes), ``roots.tar`` (what
the steps wrote outside the work dir: ``/root``, ``/opt``, ``/data``...), ``site/`` (pip's target)
and ``state.json``. A step that fails there makes the task not gradable with the step, its exit
code and its output's tail. The local sandbox restores ``work/`` and ``roots.tar`` at the start of
every episode (``Task.runtime.state``); nothing is downloaded during an episode.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from typing import Any

from compactrl.sandbox.shell_syntax import HEREDOC
from compactrl.tasksets.system_packages import INSTALL_HINT, apt_candidate, host_has_package, package_dirs
from compactrl.tasksets.terminal_bench.files import read_limited

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
_IMAGE_ONLY = {"curl", "wget", "npx", "yarn", "pnpm", "gem", "bundle", "conda", "mamba", "micromamba", "apk",
               "yum", "dnf", "microdnf", "zypper", "pipx", "uvx", "rustup", "nvm", "sdk", "add-apt-repository",
               "service", "systemctl", "snap", "brew", "dpkg", "update-alternatives", "locale-gen", "poetry",
               "pdm", "hatch", "conan", "vcpkg", "bun", "deno", "mvn", "gradle", "sbt", "dotnet", "composer",
               "cpan", "cpanm", "R", "Rscript", "julia", "opam", "cabal", "stack", "nix", "git-lfs", "docker",
               "podman", "mysql", "psql", "redis-server", "mongod", "nginx", "aws", "gsutil", "huggingface-cli"}
# mandb: the man pages' index cache (no grader reads it)
_NOOP = {"chown", "mandb", "useradd", "adduser", "groupadd", "addgroup", "usermod", "passwd", "chgrp", "ldconfig",
         "update-ca-certificates"}
_GIT_NETWORK = {"clone", "fetch", "pull", "submodule", "ls-remote"}
_CARGO_NETWORK = {"install", "fetch", "update", "add", "search", "publish"}
_GO_NETWORK = {"install", "get", "mod"}
_SEPARATORS = ("&&", "||", "|&", ";", "|", "\n", "&")


@dataclass
class Segment:
    text: str
    words: list[str]
    action: str  # "run" | "noop" | "apt" | "pip" | "image" | "git" | "npm" | "script"
    detail: Any = None


def _heredoc_end(command: str, i: int, pending: list[tuple[str, bool]]) -> int:
    """Where the bodies of the ``pending`` heredocs (``(word, strip tabs)``) that start after the
    newline at ``i`` end: the position of the newline ending the last terminator line (or the end)."""
    for word, chomp in pending:
        while i < len(command):
            end = command.find("\n", i + 1)
            end = len(command) if end < 0 else end
            line = command[i + 1:end]
            i = end
            if (line.lstrip("\t") if chomp else line) == word:
                break
    return i


def split_segments(command: str, heredocs: bool = False) -> list[tuple[str, str]]:
    """``[(segment text, separator after it)]`` of a shell command line, split at ``&&``, ``||``,
    ``;``, ``|``, ``&`` and newlines outside quotes (subshells and ``$( )`` are kept whole). With
    ``heredocs``, a here-document's body and terminator stay in the segment of its ``<<WORD``, as the
    shell reads them (a Dockerfile's ``RUN cat > main.go << 'GO'`` replayed); without, each body line
    is a segment of its own, so what a script writes into a file is also looked at."""
    out, start, i, quote, depth, pending = [], 0, 0, "", 0, []
    while i < len(command):
        c = command[i]
        if heredocs and not quote and c == "<" and (m := HEREDOC.match(command, i)) \
                and command[i - 1:i] != "<":
            pending.append((m.group(3), m.group(1) == "-"))
            i = m.end()
            continue
        if heredocs and not quote and c == "\n" and pending:
            i = _heredoc_end(command, i, pending)
            pending = []
            continue
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
            if sep in ("&", "|") and (command[i - 1:i] in (">", "<") or command.startswith("&>", i)):
                sep = None  # a redirection (2>&1, >&2, &>file, >|file), not a separator
            if sep:
                out.append((command[start:i], sep))
                i += len(sep)
                start = i
                continue
        i += 1
    out.append((command[start:], ""))
    return out


def script_lines(text: str | None) -> list[str]:
    """A shell script's logical lines: a line ending in a backslash continues on the next
    (``apt-get install -y \\`` then one package per line), as the shell reads it."""
    return re.sub(r"\\\r?\n", " ", text or "").splitlines()


def command_segments(script: str | None) -> list[str]:
    """The command segments (:func:`split_segments`) of a script's logical lines that are not comments."""
    return [text for line in script_lines(script) if not line.lstrip().startswith("#")
            for text, _sep in split_segments(line)]


_REDIRECTION = re.compile(r"^(?:\d*(?:>>?|<<?|>&|<&|>\|)|&>>?)(.*)$")


def _words(text: str) -> list[str]:
    try:
        words = shlex.split(text, comments=False)
    except ValueError:
        words = text.split()
    kept, skip = [], False
    for w in words:  # redirections are the shell's, not the command's arguments: `2>&1`, `> /dev/null`
        m = None if skip else _REDIRECTION.match(w)
        if skip or m:
            skip = bool(m) and not m.group(1)  # an operator alone: its target is the next word
            continue
        kept.append(w)
    words = kept
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
        if w in ("-i", "--index-url") and i + 1 < len(words) and "pypi.org" not in words[i + 1] \
                or w.startswith("--index-url=") and "pypi.org" not in w:
            index = words[i + 1] if "=" not in w else w.split("=", 1)[1]
            return None, f"pip install from the package index {index} (not PyPI, which prepare installs from)"
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
    if not context:  # no build context (a script's lines read alone): never the process's own folder
        return None
    full = os.path.join(context, rel)
    if os.path.isfile(full):
        with open(full, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    return None


_GIT_CLONE_VALUES = {"-b", "--branch", "--depth", "-o", "--origin", "-c", "--config", "--reference", "-u",
                     "--upload-pack", "--template", "--separate-git-dir", "--filter", "-j", "--jobs", "--shallow-since",
                     "--shallow-exclude", "--server-option", "--reference-if-able", "--bundle-uri"}


def _git_clone_url(args: list[str]) -> str | None:
    """The repository URL of ``git clone``'s arguments (after ``clone``) when it is a remote one."""
    i = args.index("clone") + 1 if "clone" in args else 0
    while i < len(args):
        w = args[i]
        if w in _GIT_CLONE_VALUES:
            i += 2
            continue
        if w.startswith("-"):
            i += 1
            continue
        return w if re.match(r"^(https?|git|ssh)://|^[\w.-]+@[\w.-]+:", w) else None
    return None


def git_mirror_path(url: str, mirror: str | None) -> str | None:
    """The bare repository standing for ``url`` in a git mirror folder laid out as
    ``<mirror>/<host>/<owner>/<name>.git`` (``https://github.com/O/N(.git)``, ``git@github.com:O/N``),
    when it is there; else None."""
    if not mirror:
        return None
    m = re.match(r"^(?:(?:https?|git|ssh)://(?:[^@/]+@)?([^/:]+)(?::\d+)?/|[\w.-]+@([\w.-]+):)(.+?)(?:\.git)?/?$", url)
    if not m:
        return None
    path = os.path.join(mirror, m.group(1) or m.group(2), *m.group(3).split("/")) + ".git"
    return path if os.path.isfile(os.path.join(path, "HEAD")) else None


def git_mirror_env(mirror: str | None) -> dict[str, str]:
    """Git configuration (``GIT_CONFIG_COUNT``/``KEY``/``VALUE`` variables, no file touched) that makes
    ``git clone`` of any repository under a host of the mirror read ``<mirror>/<host>/...`` instead:
    ``url.<mirror>/<host>/.insteadOf`` for the https, http, git and ssh spellings; the mirror's
    repositories are another user's, so they are marked safe."""
    pairs = [("safe.directory", "*")]
    for host in sorted(os.listdir(mirror)) if mirror and os.path.isdir(mirror) else ():
        if os.path.isdir(os.path.join(mirror, host)):
            for prefix in (f"https://{host}/", f"http://{host}/", f"git://{host}/", f"ssh://git@{host}/", f"git@{host}:"):
                pairs.append((f"url.{os.path.join(mirror, host)}/.insteadOf", prefix))
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def git_mirror_problem(repo: str) -> str | None:
    """Why a mirrored bare repository cannot stand for its clone, or None: a file the sandbox's user
    cannot read, or objects its refs reach that it lacks (a partial or truncated copy: the clone's
    checkout would fail, or differ from the image's)."""
    for dirpath, _dirs, names in os.walk(repo):
        for name in names:
            path = os.path.join(dirpath, name)
            if not os.stat(path).st_mode & 0o004:
                return f"{path} is not readable by the sandbox's user (chmod -R a+rX {repo})"
    try:
        res = subprocess.run(["git", "-C", repo, "rev-list", "--objects", "--all", "--missing=print"],
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"git rev-list in {repo} failed: {e}"
    if res.returncode != 0:
        return f"git rev-list in {repo} failed: {res.stderr.strip()[-200:]}"
    missing = [line[1:] for line in res.stdout.splitlines() if line.startswith("?")]
    if missing:
        where = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "HEAD"], capture_output=True, text=True,
                               timeout=60).stdout
        path = next((line.split("\t", 1)[1] for line in where.splitlines() if missing[0] in line), "")
        return (f"the mirror {repo} lacks {len(missing)} object(s) its refs reach, e.g. {missing[0][:12]}"
                + (f" ({path} at HEAD)" if path else "") + ": a complete mirror (git clone --mirror) is needed")
    return None


def _git_head(repo: str) -> str:
    try:
        res = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _go_mod_local(args: list[str]) -> bool:
    """``go mod init`` / ``go mod edit`` write go.mod and fetch nothing (``tidy``, ``download`` do)."""
    words = [w for w in args if not w.startswith("-")]
    return words[:1] == ["mod"] and words[1:2] in (["init"], ["edit"])


def classify(text: str, files: dict[str, str], context: str) -> Segment:
    words = _words(text)
    if not words:
        return Segment(text, words, "run")
    cmd, rest = os.path.basename(words[0]), words[1:]
    sub = next((w for w in rest if not w.startswith("-")), "")
    if cmd in _APT:
        if sub != "install":
            return Segment(text, words, "noop")
        args = rest[rest.index("install") + 1:]
        args = args[:next((i for i, w in enumerate(args) if w.startswith("#")), len(args))]  # a trailing comment
        pkgs = [re.split(r"[=:]", w)[0] for w in args if not w.startswith("-")]
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
    if cmd == "uv" and sub == "venv" and not any(w.startswith("--python") or w == "-p" for w in rest):
        return Segment(text, words, "run")  # a venv of an interpreter found here: no download
    if cmd == "uv":
        return Segment(text, words, "image", f"uv {sub} (a project environment from the network)")
    if cmd == "npm":
        return _classify_npm(text, words, sub)
    if cmd == "git" and sub == "clone" and _git_clone_url(rest):
        return Segment(text, words, "git", [_git_clone_url(rest)])
    if cmd in _IMAGE_ONLY or (cmd == "git" and sub in _GIT_NETWORK) or (cmd == "cargo" and sub in _CARGO_NETWORK) \
            or (cmd == "go" and sub in _GO_NETWORK and not _go_mod_local(rest)):
        # the cause: what it fetches (`wget -P /app/data https://...` names the URL, not the folder)
        at = next((i for i, w in enumerate(words) if "://" in w), None)
        if at is None:
            return Segment(text, words, "image", f"{cmd} {sub}".strip())
        shown = [cmd, words[at]] if cmd in ("curl", "wget") else [cmd, *words[1:at + 1]][-6:]
        return Segment(text, words, "image", " ".join(shown))
    targets = [w for w in rest if not w.startswith("-")]
    if _PYTHON.match(cmd) and targets and targets[0].endswith(".py"):
        # a script from the build context that downloads (a dataset from the Hugging Face hub, a URL): named
        # before any replay, as the cause, rather than the step's failure here
        script = _context_text(targets[0].replace("/app/", "", 1) if targets[0].startswith("/") else targets[0],
                               files, context) or _context_text(os.path.basename(targets[0]), files, context)
        fetch = script_download(script or "")
        if fetch:
            return Segment(text, words, "image", f"{os.path.basename(targets[0])} downloads {fetch}")
    if cmd in ("bash", "sh") and targets and targets[0].endswith(".sh"):
        found = _classify_build_script(text, words, targets[0], files, context)
        if found is not None:
            return found
    if cmd in _NOOP or (cmd == "rm" and _system_paths(targets)):
        return Segment(text, words, "noop")
    if cmd == "rm" and any(t.startswith("/") and t.strip("/").split("/")[0] in _NOT_TASK_ROOTS
                           and not t.startswith(("/tmp/", "/var/tmp/", "/var/log/")) for t in targets):
        # `rm -rf` of a system file that this machine lacks "succeeds" and changes nothing here; one it
        # has is removed in the task's root layer
        absent = [t for t in targets if t.startswith("/") and not glob.glob(t)]
        if absent:
            return Segment(text, words, "image", f"removes {absent[0]}, which this machine lacks (the image's own "
                                                 "system files)")
    return Segment(text, words, "run")


def _classify_build_script(text: str, words: list[str], target: str, files: dict[str, str],
                           context: str) -> Segment | None:
    """A build script from the context (``bash build.sh``): what it runs counts as the step's (its exit status
    may hide a failed download, e.g. a ``git clone`` followed by more commands). None: an ordinary run."""
    script = _context_text(target.replace("/app/", "", 1) if target.startswith("/") else target,
                           files, context) or _context_text(os.path.basename(target), files, context)
    clones: list[str] = []
    wheels: list[str] = []  # what the uv project it builds installs (from the wheelhouse, offline)
    uv_project = False
    for line in script_lines(script):
        line = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        for inner, _sep in split_segments(_UV_INSTALLER.sub(" true ", line)):  # the installer is served
            seg = classify(inner, files, context)
            uv_project = uv_project or _uv_subcommand(seg.words) == "init"
            if uv_project and (uv_project_offline(seg.words) or seg.action == "pip" and seg.words[0] == "uv"):
                reqs = seg.detail if seg.action == "pip" else uv_add_requirements(seg.words)
                wheels += [r for r in reqs if r not in wheels]
                continue
            if seg.action == "image":
                return Segment(text, words, "image", f"{os.path.basename(target)} runs {seg.detail}")
            if seg.action == "git":
                clones += seg.detail
    if clones:  # the clones it runs, from a git mirror (see plan)
        return Segment(text, words, "git", clones)
    served = served_installers(script)
    if served or wheels:  # run as written, with the installer served and the project's wheels at hand
        return Segment(text, words, "script", {"script": os.path.basename(target), "served": served,
                                               "wheels": wheels})
    return None


# npm subcommands that install from the registry (fetched at prepare time, then run offline) and ones
# that fetch nothing (run as they are)
NPM_INSTALL = {"ci", "install", "i", "add", "isntall", "clean-install", "install-clean"}
_NPM_LOCAL = {"run", "run-script", "test", "t", "start", "stop", "restart", "build", "rebuild", "prune", "ls", "list",
              "ll", "la", "config", "c", "get", "set", "pack", "version", "help", "root", "prefix", "bin", "explain",
              "query", "pkg", "cache", ""}


def _classify_npm(text: str, words: list[str], sub: str) -> Segment:
    """``npm ci`` / ``npm install`` (local, not ``-g``): fetched at prepare time (``"npm"``); ``npm run
    build`` and the like: run; anything else (``npm publish``, ``npm install -g``...): the image's."""
    if sub in NPM_INSTALL and not any(w in ("-g", "--global", "--location=global") for w in words):
        return Segment(text, words, "npm", words)
    if sub in _NPM_LOCAL:
        return Segment(text, words, "run")
    return Segment(text, words, "image", f"npm {sub}".strip())


_CACHES = ("/var/lib/apt/lists", "/var/cache/apt", "/var/cache/debconf", "/var/cache/apk", "/root/.cache/pip")


def _system_paths(paths: list[str]) -> bool:
    """Only a package manager's caches (an image-size clean-up that changes no file a task uses). Any
    other removal outside the writable folders (``rm -rf .../site-packages/pip`` to break an image on
    purpose) is run, fails on the read-only root, and so makes the task not gradable."""
    return bool(paths) and all(p.startswith(_CACHES) for p in paths)


# Top-level folders of the image that are the system's (read-only here) or the sandbox's own.
_NOT_TASK_ROOTS = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "tmp", "sys", "run",
                   "var", "boot", "", ".", ".."}
_VAR_PATH = re.compile(r"(?<![\w.$/~-])/var/([A-Za-z0-9_][A-Za-z0-9_.-]*)(?:/[^\s;&|'\"]*)?")
_ABS_PATH = re.compile(r"(?<![\w.$/~-])/([A-Za-z0-9_][A-Za-z0-9_.-]*)")


def task_roots(steps: list[dict], workdir: str | None) -> list[str]:
    """Top-level folders outside the system ones that the Dockerfile's steps create, fill or run in
    (``/protected``, ``/app`` above a ``/app/site`` work dir): the local sandbox makes each a private
    writable folder, and a prepared state keeps what the steps put there."""
    found = set()
    for step in steps:
        # a RUN's working folder too: one inherited from the base image (t-bench's /app) exists there
        texts = [step.get("command", ""), step.get("path", ""), step.get("workdir", "")] + [
            p[1] for p in step.get("pairs", [])]
        for text in texts:
            found.update(m.group(1) for m in _ABS_PATH.finditer(text or ""))
            # /var/lib/bench, /var/cache/x, /var/www: the second level of /var is the task's (/var itself
            # holds the sandbox's own mounts); the package managers' caches are not
            found.update("var/" + m.group(1) for m in _VAR_PATH.finditer(text or "")
                         if not ("/var/" + m.group(0).split("/var/", 1)[1]).startswith(_CACHES))
    if workdir:
        found.add(workdir.strip("/").split("/")[0])
    return sorted("/" + f for f in found if f not in _NOT_TASK_ROOTS and "/" + f != workdir
                  and f not in ("var/tmp", "var/run", "var/lock"))


# Interactive terminal tools that images install for the agent's session (the harness records it with
# asciinema inside tmux); no grader uses them, so their absence here changes no verdict.
SESSION_TOOLS = {"asciinema", "tmux", "nano", "vim", "vim-tiny", "less", "screen", "htop", "man-db", "emacs-nox"}


def apt_missing(packages: list[str]) -> list[str]:
    """The packages of an ``apt-get install`` this machine lacks (terminal session tools left out)."""
    return [p for p in packages if p not in SESSION_TOOLS and not host_has_package(p)]


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
    """What the local backend does for one task's Dockerfile (JSON in ``Task.build.plan``)."""

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
    root_layer: bool = False
    """The steps write system files (``/etc/...``, ``mv x /usr/local/bin/``, ``chmod 700 /protected``):
    they run as root, as the engine runs them, and what they change under the system folders is kept
    as the task's root layer (:func:`needs_root`)."""

    image_root: bool = False
    """The reference solution manages the image's users (``useradd``, ``chpasswd``, ``su``, ``chown git:git``):
    the episode's shell is root in a user namespace of its own, the image's other uids mapped beside it, and
    the account files are in the root layer (:func:`grant_users`)."""
    gone: list[str] = field(default_factory=list)
    """Roots the steps use and then remove whole (``rm -rf /build``): writable while they run, not in an episode."""
    owned: list[list] = field(default_factory=list)
    """``[path, recursive]`` of system files and folders copied into the root layer at prepare time, owned by
    the sandbox's user, where a reference solution writes as the image's root (:func:`grant_system_writes`)."""
    dirs: list[str] = field(default_factory=list)
    """Folders made at prepare time (a package's ``/var/lib/<name>``: :func:`package_dirs`)."""
    wheelhouse: list[str] = field(default_factory=list)
    """What the reference solution installs (and what a uv project a build script creates adds): downloaded
    (wheels and their dependencies) into the state's ``wheelhouse/`` at prepare time, offered offline to an
    episode's pip and uv (:func:`wheelhouse_env`), never pre-installed: a policy that does not install them
    does not have them."""
    git: dict[str, dict] = field(default_factory=dict)
    """``git clone`` URLs the steps run -> ``{"mirror": bare repository, "head": its HEAD}`` (:func:`git_mirror_path`)."""
    git_mirror: str | None = None
    """The mirror folder the clones come from (``<download cache>/git``)."""
    downloads: list[str] = field(default_factory=list)
    """URLs the steps download that :mod:`tb_downloads` rebuilds from a reachable registry at prepare time
    (the step copies the file from the state's ``downloads/`` instead)."""
    tools: list[str] = field(default_factory=list)
    """Wheels of tools a known installer script would fetch (``uv==0.5.11`` for astral.sh's uv
    installer), installed at prepare time under ``tools/<name>-<version>`` of the state (:func:`map_installers`)."""
    served: dict[str, str] = field(default_factory=dict)
    """Installer URLs the reference solution fetches (``https://astral.sh/uv/0.7.13/install.sh``) -> the tool
    wheel they install (``uv==0.7.13``, in :attr:`tools`): an episode's ``curl`` and ``wget`` serve them
    offline (:func:`write_served`), to the reference solution and to any policy alike."""

    def to_json(self) -> dict:
        return {"key": self.key, "steps": self.steps, "pip": self.pip, "env": self.env, "mapped": self.mapped,
                "roots": self.roots, **({"root_layer": True} if self.root_layer else {}),
                **({"image_root": True} if self.image_root else {}),
                **({"tools": self.tools} if self.tools else {}),
                **({"gone": self.gone} if self.gone else {}), **({"owned": self.owned} if self.owned else {}),
                **({"dirs": self.dirs} if self.dirs else {}),
                **({"served": self.served} if self.served else {}),
                **({"downloads": self.downloads} if self.downloads else {}),
                **({"wheelhouse": self.wheelhouse, "pip_command": "python3 -m pip"}
                   if self.wheelhouse else {}),
                **({"git": self.git, "git_mirror": self.git_mirror} if self.git else {})}


# `curl -LsSf https://astral.sh/uv/0.5.11/install.sh | sh` (wget -qO- too; optional env assignments)
_UV_INSTALLER = re.compile(r"(?:curl|wget)\s[^|;&\n]*?https?://astral\.sh/uv/(?:(\d+\.\d+(?:\.\d+)?)/)?install\.sh"
                           r"[^|;&\n]*\|\s*(?:env\s+(?:\w+=\S*\s+)*)?(?:sh|bash)\b(?:\s+-s\b)?(?:\s+--\s+[^;&|\n]*)?")
TOOLS_MARK = "__TOOLS__"
DOWNLOADS_MARK = "__DOWNLOADS__"


def release_download(text: str, env: dict[str, str], workdir: str) -> tuple[str, str] | None:
    """``(url, destination)`` when the segment downloads a release :mod:`tb_downloads` can rebuild, else None."""
    from compactrl.tasksets.terminal_bench import downloads as tb_downloads

    words = [_expand(w, env) for w in _words(text)]
    got = tb_downloads.download_target(words, workdir)
    return got if got and tb_downloads.release_for(got[0]) else None


def _uv_requirement(version: str | None) -> str:
    return f"uv=={version}" if version else "uv"


def _uv_install(version: str | None, src: str, assigns: list[str] = ()) -> str:
    """Shell that does what astral.sh's uv installer of ``version`` does, from the ``uv`` wheel's ``bin``
    folder ``src``: ``uv`` and ``uvx`` into ``$XDG_BIN_HOME`` or ``~/.local/bin`` (0.5 and later;
    ``~/.cargo/bin`` before), or ``$UV_INSTALL_DIR`` / ``$UV_UNMANAGED_INSTALL`` when set, with the ``env``
    file that puts that folder on ``PATH``."""
    old = bool(version) and tuple(int(x) for x in version.split(".")[:2]) < (0, 5)
    home = '${CARGO_HOME:-$HOME/.cargo}/bin' if old else '${XDG_BIN_HOME:-$HOME/.local/bin}'
    dest = f'"${{UV_UNMANAGED_INSTALL:-${{UV_INSTALL_DIR:-{home}}}}}"'
    env_line = 'case ":$PATH:" in *:"$D":*) ;; *) export PATH="$D:$PATH" ;; esac'
    return (f"{{ {''.join(a + '; ' for a in assigns)}D={dest}; mkdir -p \"$D\" && cp {src}/uv {src}/uvx \"$D/\" && "
            f"printf '%s\\n' \"D='$D'\" {shlex.quote(env_line)} > \"$D/env\"; }}")


_UV_INSTALLER_URL = re.compile(r"https?://astral\.sh/uv/(?:(\d+\.\d+(?:\.\d+)?)/)?install\.sh")


def served_installers(script: str | None) -> dict[str, str]:
    """The installer URLs a script pipes to a shell that an episode can be served offline (astral.sh's uv
    installer) -> the tool wheel each installs (``{"https://astral.sh/uv/0.7.13/install.sh": "uv==0.7.13"}``)."""
    found: dict[str, str] = {}
    for m in _UV_INSTALLER.finditer(script or ""):
        url = _UV_INSTALLER_URL.search(m.group(0))
        found[url.group(0)] = _uv_requirement(url.group(1))
    return found


def map_installers(command: str) -> tuple[str, list[str], list[str]]:
    """``(command, wheels, notes)``: well-known installer scripts piped to a shell replaced by the same
    tool from PyPI, copied where the installer puts it. astral.sh's uv installer: the ``uv`` wheel
    of that version (its ``uv`` and ``uvx``) into ``$XDG_BIN_HOME`` or ``~/.local/bin`` (0.5 and
    later; ``~/.cargo/bin`` before), with the ``env`` file it writes there."""
    wheels: list[str] = []
    notes: list[str] = []

    def sub(m: re.Match) -> str:
        version = m.group(1)
        req = _uv_requirement(version)
        wheels.append(req)
        notes.append(f"astral.sh's uv installer ({version or 'latest'}): {req} from PyPI at prepare time, "
                     "copied where the installer puts it")
        # `| env UV_UNMANAGED_INSTALL=/x sh`: the installer's shell had those variables
        assigns = re.findall(r"\b\w+=\S*", m.group(0).split("|", 1)[1])
        return _uv_install(version, f"{TOOLS_MARK}/{req.replace('==', '-')}/bin", assigns)

    return _UV_INSTALLER.sub(sub, command), wheels, notes


_SYSTEM_TOPS = {"etc", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}


def needs_root(words: list[str]) -> bool:
    """Whether a ``RUN`` command (its words) changes what only root may change: a path under the system
    folders (``/etc``, ``/usr``...) named as an argument, or a mode/owner change of a path outside the
    work dir (``chmod 700 /protected``). Reading a system path (``python3 /usr/bin/x``) also counts: a
    root build changes nothing for such a step."""
    if not words:
        return False
    cmd = os.path.basename(words[0])
    if cmd in ("cat", "ls", "test", "[", "echo", "printf") and not any(w in (">", ">>") or w.startswith(">")
                                                                        for w in words):
        return False
    for w in words[1:]:
        path = w.split("=", 1)[-1]
        if path.startswith("/") and path.strip("/").split("/")[0] in _SYSTEM_TOPS:
            return True
        if cmd in ("chmod", "chown", "chgrp", "chattr", "setfacl") and path.startswith("/") \
                and not path.startswith(("/tmp", "/app")):
            return True
    return False


def _expand(value: str, env: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced as the engine expands ENV values."""
    def sub(m: re.Match) -> str:
        got = env.get(m.group(1) or m.group(3), "")
        return got if got or m.group(2) is None else m.group(2)
    return re.sub(r"\$(?:\{(\w+)(?::?-([^}]*))?\}|(\w+))", sub, value)


def solution_requirements(script: str | None) -> list[str]:
    """What a script ``pip install``s (``uv pip install``), ``uv add``s or runs ``uvx --with`` (a reference solution, a test script: the
    harness's containers have the network, the local sandbox has none): those requirements are
    installed at prepare time instead."""
    reqs: list[str] = []
    for line in script_lines(script):
        for text, _sep in split_segments(line):
            seg = classify(text, {}, "")
            found = seg.detail if seg.action == "pip" else []
            if seg.words and os.path.basename(seg.words[0]) in ("uvx", "uv"):  # uvx --with numpy==2.1.3 pytest ...
                found = found + [seg.words[i + 1] for i, w in enumerate(seg.words[:-1]) if w in ("--with", "-w")]
                found += uv_add_requirements(seg.words)
            reqs += [r for r in found if r not in reqs]
    return reqs


def unpreparable_install(script: str | None) -> str | None:
    """The first ``pip install`` (``uv pip install``) of a script that prepare cannot do ahead from PyPI (another
    package index, a URL, a local project), or None."""
    for text in command_segments(script):
        seg = classify(text, {}, "")
        if seg.action == "image" and str(seg.detail).startswith("pip install"):
            return str(seg.detail)
    return None


# `uv add` options that take a value (the rest are flags)
_UV_ADD_VALUES = {"--group", "--optional", "--package", "--script", "--tag", "--branch", "--rev", "--extra",
                  "--marker", "-m", "--bounds", "--python", "-p", "--directory", "--project", "--index",
                  "--default-index", "--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--index-strategy",
                  "--resolution", "--prerelease", "--exclude-newer", "--config-file", "--cache-dir", "--color",
                  "--constraints", "-c", "--requirements", "-r"}


def uv_added_requirements(script: str | None) -> list[str]:
    """What a script ``uv add``s, in order (the requirements of a uv project it builds)."""
    return list(dict.fromkeys(r for line in script_lines(script) for text, _sep in split_segments(line)
                              for r in uv_add_requirements(classify(text, {}, "").words)))


def uv_add_requirements(words: list[str]) -> list[str]:
    """What ``uv add [options] REQ...`` adds (``uv add pytest==8.4.1 rdkit``): its requirement arguments.
    A path, URL or ``-r`` file gives none here (the reason comes from the network check)."""
    if len(words) < 2 or os.path.basename(words[0]) != "uv":
        return []
    rest = words[1:]
    sub = next((w for w in rest if not w.startswith("-")), "")
    if sub != "add":
        return []
    args, out, i = rest[rest.index("add") + 1:], [], 0
    while i < len(args):
        w = args[i]
        if w.startswith("-"):
            i += 2 if w in _UV_ADD_VALUES else 1
            continue
        if "://" not in w and not w.startswith((".", "/", "git+")):
            out.append(w)
        i += 1
    return out


_FETCHERS = {"curl", "wget", "git", "uv", "uvx", "npm", "npx", "yarn", "pnpm", "cargo", "go", "gem", "conda", "pipx",
             "apk", "yum", "dnf", "rustup", "bun", "deno", "aws", "gsutil", "huggingface-cli"}
# Python that downloads from the Hugging Face hub: the call, and its first argument (a literal, or a name
# assigned a literal in the script)
_HUB_CALL = re.compile(r"\b(from_pretrained|load_dataset|hf_hub_download|snapshot_download|SentenceTransformer)\(\s*"
                       r"(?:(?:repo_id|pretrained_model_name_or_path|path)\s*=\s*)?(?:['\"]([^'\"]+)['\"]|([A-Za-z_]\w*))")


_DATASET_BUILDERS = {"csv", "json", "parquet", "text", "arrow", "pandas", "imagefolder", "audiofolder", "webdataset",
                     "sql", "generator"}


# command-line tools that fetch a model from the hub: `huggingface-cli download org/name`, `hf download`,
# `mteb run -m org/name` (eval-mteb)
_HUB_CLI = re.compile(r"(?m)^[^#\n]*?\b(?:(?:huggingface-cli|hf)\s+download\s+|mteb\s+run\b[^\n]*?(?:-m|--model)\s+)"
                      r"['\"]?([A-Za-z0-9][\w.-]*/[\w.-]+)")


def _hub_download(script: str) -> str | None:
    """The first Hugging Face hub download a script makes: from its Python (``from_pretrained("Qwen/...")``,
    ``load_dataset(name)`` with ``name = "org/set"``, ``SentenceTransformer("org/name")``) or a command-line
    tool (:data:`_HUB_CLI`), or None; a path (``/``, ``.``, ``~``) is local."""
    cli = _HUB_CLI.search(script)
    if cli:
        return f"{cli.group(0).strip()} (the Hugging Face hub)"
    names = dict(re.findall(r"(?m)^\s*([A-Za-z_]\w*)\s*=\s*['\"]([^'\"]+)['\"]", script))
    for m in _HUB_CALL.finditer(script):
        value = m.group(2) if m.group(2) is not None else names.get(m.group(3) or "")
        if m.group(1) == "load_dataset" and value in _DATASET_BUILDERS:
            continue  # a loader of local files (`load_dataset("csv", data_files=...)`)
        if value and not value.startswith(("/", ".", "~", "$")) and not re.search(r"\.(json|csv|parquet|txt|bin)$", value):
            return f"{m.group(1)}({value!r}) (the Hugging Face hub)"
    return None


_LOCAL_URL = re.compile(r"^https?://(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])(?:[:/]|$)")
_PY_FETCH = re.compile(r"\b(requests\.(?:get|post|head)|urlopen|urlretrieve|wget\.download|httpx\.(?:get|stream)|"
                       r"download_url|gdown\.download)\(\s*['\"](https?://[^'\"\s]+)")


def script_download(script: str) -> str | None:
    """What a script a build step runs downloads, named (``allenai/c4 from the Hugging Face hub:
    load_dataset('allenai/c4')``, ``https://host/file (urlretrieve)``), or None; this machine's loopback aside."""
    hub = _hub_download(script)
    if hub:
        return f"from the Hugging Face hub: {hub.replace(' (the Hugging Face hub)', '')}"
    for m in _PY_FETCH.finditer(script):
        if not _LOCAL_URL.match(m.group(2)):
            return f"{m.group(2)} ({m.group(1)})"
    return None


# what a failed step's output says when the step reached for the network (the cause, not the last lines)
_NETWORK_FAILURE = re.compile(
    r".*(?:Could not resolve host|Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|Failed to establish a new connection|getaddrinfo failed|unable to access '[^']*'|Could not connect to"
    r"|LocalEntryNotFoundError|couldn't connect to server|No address associated with hostname"
    r"|Failed to download|failed to fetch).*")


def network_failure(output: str) -> str | None:
    """The first line of a failed step's output that shows it reached for the network, or None."""
    m = _NETWORK_FAILURE.search(output)
    return m.group(0).strip()[:240] if m else None


def _go_sources(steps: list[dict], files: dict[str, str], context: str) -> str:
    """The Go an image's build has: what its ``RUN`` steps write (heredocs, ``printf > go.mod``), its
    task files and the build context's ``*.go`` and ``go.mod`` files."""
    texts = [s["command"] for s in steps if s.get("op") == "run"]
    texts += [t for p, t in files.items() if p.endswith((".go", "go.mod"))]
    for dirpath, _dirs, names in os.walk(context) if context else ():
        texts += [read_limited(os.path.join(dirpath, n), 1 << 20) or "" for n in names
                  if n.endswith(".go") or n == "go.mod"]
    return "\n".join(texts)


def _go_std_only(script: str | None) -> bool:
    """Whether the Go code a script writes imports the standard library only (no import path whose
    first element has a dot, ``github.com/...``, ``golang.org/x/...``) and its go.mod requires nothing."""
    text = script or ""
    if re.search(r"(?m)^\s*require\b", text):
        return False
    imports = re.findall(r'(?m)^\s*(?:import\s+)?(?:\w+\s+)?"([^"\s]+)"\s*$', text)
    return not any("." in path.split("/")[0] for path in imports)


# `uv` commands on a project, and the `uv add` options that fetch what the wheelhouse cannot hold
_UV_PROJECT = {"init", "add", "run", "sync", "lock", "remove", "tree", "export"}
_UV_ADD_ELSEWHERE = {"-r", "--requirements", "--index", "--default-index", "--index-url", "-i", "--extra-index-url",
                     "--find-links", "-f", "--git", "--editable", "--script"}
_UV_GLOBAL_VALUES = {"--directory", "--project", "--cache-dir", "--config-file", "--color", "--python", "-p"}


def _uv_subcommand(words: list[str]) -> str | None:
    """``add`` for ``uv --directory /app add flask``; None when the words are not a ``uv`` command."""
    if not words or os.path.basename(words[0]) != "uv":
        return None
    i = 1
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in _UV_GLOBAL_VALUES else 1
    return words[i] if i < len(words) else None


def uv_project_offline(words: list[str]) -> bool:
    """Whether a ``uv`` command of a project the script itself created (``uv init``) runs offline from the
    task's wheelhouse: ``uv add`` of plain requirements (they are in the wheelhouse:
    :func:`solution_requirements`), ``uv run``/``sync``/``lock`` of what was added. A requirements file,
    another index, a URL or a git source is fetched from where it says."""
    sub = _uv_subcommand(words)
    if sub not in _UV_PROJECT:
        return False
    return sub != "add" and "--with-requirements" not in words or sub == "add" and not any(
        w.split("=", 1)[0] in _UV_ADD_ELSEWHERE or "://" in w or w.startswith("git+") for w in words)


def uv_project_requirements(files: dict[str, str], context: str) -> list[str] | None:
    """What ``uv sync`` installs for the uv project a task ships (its ``pyproject.toml`` among the files
    or in the build context), or None when it ships none: every package its ``uv.lock`` pins from a
    registry (``name==version``), else its ``[project] dependencies`` and the ``dev`` group ``uv sync``
    installs by default. They are fetched from the package index at prepare time, like pip installs."""
    def read(name: str) -> str | None:
        return files.get(name) if name in files or not context else _context_text(name, files, context)

    text = read("pyproject.toml")
    if text is None:
        return None
    lock = read("uv.lock")
    try:
        if lock is not None:
            pins = [f"{p['name']}=={p['version']}" for p in tomllib.loads(lock).get("package", [])
                    if isinstance(p, dict) and "registry" in (p.get("source") or {}) and p.get("version")]
            return pins
        project = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return None
    deps = list((project.get("project") or {}).get("dependencies") or [])
    deps += [d for d in (project.get("dependency-groups") or {}).get("dev") or [] if isinstance(d, str)]
    deps += list((project.get("tool", {}).get("uv") or {}).get("dev-dependencies") or [])
    return [d for d in deps if isinstance(d, str)]


def solution_network(script: str | None, has_project: bool = False) -> str | None:
    """What in a reference solution fetches from the network (``curl ... | sh``, ``uv add flask``,
    ``git clone``), or None. The harness's agent has the network; the local sandbox has none, except
    what an episode is served offline: astral.sh's uv installer (:func:`served_installers`), and a uv
    project the solution creates with ``uv init`` (:func:`uv_project_offline`) when the task ships no
    project of its own (``has_project``: a ``pyproject.toml`` among its files, whose dependencies the
    wheelhouse does not hold)."""
    uv_project = False
    for line in script_lines(script):
        if line.lstrip().startswith("#"):
            continue
        for text, _sep in split_segments(_UV_INSTALLER.sub(" true ", line)):
            seg = classify(text, {}, "")
            if not has_project and _uv_subcommand(seg.words) == "init":
                uv_project = True
            if uv_project and uv_project_offline(seg.words):
                continue
            local = re.search(r"(//|@|^|\s)(localhost|127\.0\.0\.1|0\.0\.0\.0)\b", " ".join(seg.words[1:]))
            if seg.words[:3] == ["go", "mod", "tidy"] and _go_std_only(script):
                continue  # nothing to fetch: every package the Go code imports is the standard library's
            if seg.action == "image" and seg.words and os.path.basename(seg.words[0]) in _FETCHERS and not local:
                return str(seg.detail)
            if seg.action == "npm":
                return " ".join(seg.words[:2])
            if seg.action == "git":
                return f"git clone {seg.detail[0]}"
            if seg.action == "apt":
                missing = apt_missing(seg.detail)
                if missing:
                    return f"apt-get install {' '.join(missing)}, which this machine lacks{INSTALL_HINT}"
    return _hub_download(script or "")


_WRITERS = {"cp", "mv", "install", "ln", "tee", "rm", "mkdir", "touch", "sed", "chmod", "truncate"}


def solution_system_writes(script: str | None) -> str | None:
    """The first system file (under ``/etc``, ``/usr``...) a reference solution writes, moves or removes
    (``cat > /etc/nginx/conf.d/x``, ``sed -i ... /etc/x``, ``rm -f /etc/nginx/sites-enabled/default``),
    or None. The image's agent is root; the local sandbox's shell is not, so such a solution can only
    change the system files its task's root layer put there (:func:`grant_system_writes`)."""
    return next(iter(system_writes(script)), None)


def system_writes(script: str | None) -> list[str]:
    """Every system path a script writes, moves or removes (:func:`solution_system_writes`), in order."""
    out: list[str] = []
    for line in script_lines(script):
        if line.lstrip().startswith("#"):
            continue
        out += re.findall(r"(?<![<\d&])>>?\s*(/(?:etc|usr|bin|sbin|lib\w*)/[^\s;&|'\"]*)", line)
        for text, _sep in split_segments(line):
            words = _words(text)
            if not words or os.path.basename(words[0]) not in _WRITERS:
                continue
            if words[0] == "sed" and not any(w.startswith("-i") for w in words):
                continue
            args = [w for w in words[1:] if not w.startswith("-")]
            targets = args[-1:] if words[0] in ("cp", "mv", "install", "ln") else args
            out += [t for t in targets if re.match(r"/(etc|usr|bin|sbin|lib\w*)/", t)]
    return list(dict.fromkeys(out))


_USER_TOOLS = {"adduser", "useradd", "usermod", "groupadd", "addgroup", "chpasswd", "passwd", "su", "runuser"}


def solution_users(script: str | None) -> str | None:
    """The first command of a script that manages or becomes the image's other users (``adduser git``,
    ``chpasswd``, ``su - git -c ...``, ``chown git:git``), or None: the local sandbox has one unprivileged
    user and no others to create, log in as (sshd's password logins) or give files to."""
    for text in command_segments(script):
        words = _words(text)
        if not words:
            continue
        tool = os.path.basename(words[0])
        if tool in _USER_TOOLS or (tool == "sudo" and "-u" in words):
            return " ".join(words[:3])
        if tool in ("chown", "chgrp"):
            owner = next((w for w in words[1:] if not w.startswith("-")), "")
            if owner.split(":")[0].split(".")[0] not in ("", "root", "0", "$(whoami)", "$USER"):
                return " ".join(words[:3])
    return None


def solution_ssh_server(script: str | None) -> str | None:
    """The first command of a script that starts an SSH server (``/usr/sbin/sshd``, ``service ssh start``,
    ``systemctl restart sshd``), or None: sshd listens on port 22, which only a root of the network
    namespace's own user namespace may bind; the local sandbox's root (:func:`grant_users`) is not one."""
    for text in command_segments(script):
        words = _words(text)
        if not words:
            continue
        tool = os.path.basename(words[0])
        services = [w for w in words[1:] if not w.startswith("-")]
        if tool == "sshd" or (tool in ("service", "systemctl") and any(w in ("ssh", "sshd", "ssh.service",
                                                                               "sshd.service") for w in services)
                              and any(w in ("start", "restart") for w in services)) \
                or (words[0] in ("/etc/init.d/ssh", "/etc/init.d/sshd") and services[:1] in (["start"], ["restart"])):
            return " ".join(words[:3])
    return None


def owned_system_paths(writes: list[str], exists=os.path.lexists) -> list[tuple[str, bool]]:
    """``(path, recursive)`` of what the sandbox's user must own for those writes to succeed, as the image's
    root would: a configuration folder under ``/etc`` whole (``/etc/nginx`` for ``/etc/nginx/conf.d/x``: a
    solution also edits and removes its other files), elsewhere the folder that receives the file and the
    file itself where it exists (``/usr/local/bin``, not the whole of ``/usr``)."""
    out: dict[str, bool] = {}
    for path in writes:
        path = os.path.normpath(path)
        parts = path.strip("/").split("/")
        if parts[0] == "etc" and len(parts) > 2 and os.path.isdir(f"/etc/{parts[1]}"):
            out[f"/etc/{parts[1]}"] = True
            continue
        folder = os.path.dirname(path)
        while folder != "/" and not os.path.isdir(folder):  # `mkdir -p /etc/x/y`: its nearest existing folder
            folder = os.path.dirname(folder)
        if folder != "/":
            out.setdefault(folder, False)
        if path != folder and exists(path):
            out.setdefault(path, os.path.isdir(path) and not os.path.islink(path) and parts[0] == "etc")
    return list(out.items())


def grant_system_writes(plan: Plan, script: str | None, packages: list[str]) -> list[str]:
    """Let a reference solution configure the system as the image's root does (nginx: edit ``/etc/nginx``,
    make ``/var/www/html``, start the service): what it writes under the system folders (:func:`system_writes`)
    is copied into the task's root layer at prepare time, owned by the sandbox's user; the folders its
    packages own under ``/var`` (:func:`package_dirs`), ``/run`` and the top folders the script writes
    outside the system ones are the task's writable roots. Returns the written paths (nothing: no change)."""
    writes = system_writes(script)
    if not writes:
        return []
    owned = owned_system_paths(writes)
    dirs = package_dirs(packages)
    roots = {"/run"} | {"/var/" + d.split("/")[2] for d in dirs}
    roots.update(r for r in task_roots([{"op": "run", "command": "\n".join(script_lines(script))}], None)
                 if r.startswith("/var/"))
    plan.owned = [[p, r] for p, r in owned]
    plan.dirs = dirs
    plan.roots = sorted({*plan.roots, *roots})
    plan.root_layer = True
    plan.mapped.append(
        f"the reference solution changes system files as the image's root ({', '.join(writes[:4])}): "
        + ", ".join(p + ("/" if r else "") for p, r in owned) + " copied into the task's root layer, owned by the "
        "sandbox's user" + (f"; its packages' folders made ({', '.join(dirs)})" if dirs else "")
        + f"; writable here: {', '.join(sorted(roots))}")
    return writes


# the account files `useradd`, `groupadd`, `chpasswd` and `passwd` rewrite (each replaced by a new file in /etc),
# their backups, and the lock file they open first (a file of an owner the shell's namespace does not map
# cannot be opened for writing there, even by its root)
ACCOUNT_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow", "/etc/subuid", "/etc/subgid",
                 "/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-", "/etc/subuid-", "/etc/subgid-",
                 "/etc/.pwd.lock")


def grant_users(plan: Plan, users: str) -> None:
    """Let a reference solution manage the image's users as the image's root does (``useradd -m git``,
    ``echo git:pw | chpasswd``, ``su - git -c ...``, ``chown git:git /srv/repo``): the account files are
    copied into the task's root layer, owned by the sandbox's user (as the layer's ``/etc``), and the
    episode's shell runs as root in a user namespace of its own whose root is that user and whose other uids
    and gids (1-65535) map to an unused range of this machine's, so the users it adds own their files."""
    have = [[p, False] for p in ACCOUNT_FILES if os.path.isfile(p)]
    plan.owned = [*plan.owned, *(o for o in have if o not in plan.owned)]
    plan.roots = sorted({*plan.roots, "/run"})
    plan.root_layer = plan.image_root = True
    plan.mapped.append(f"the reference solution manages the image's users ({users}): the shell runs as root in a user "
                       "namespace of its own, the image's other uids mapped beside it; "
                       + ", ".join(p for p, _ in have if not p.endswith(("-", ".lock"))) + " (and their backups and lock) "
                       "copied into the task's root layer")


def apt_packages(steps: list[dict], scripts: list[str | None] = ()) -> list[str]:
    """Every package the Dockerfile's ``RUN`` steps (and the given scripts: a reference solution)
    ``apt-get install``, in order, less the terminal session tools."""
    out: list[str] = []
    texts = [s["command"] for s in steps if s.get("op") == "run"] + [t for t in scripts if t]
    for text in texts:
        for piece in command_segments(text):
            seg = classify(piece, {}, "")
            if seg.action == "apt":
                out += [p for p in seg.detail if p not in SESSION_TOOLS and p not in out]
    return out


def go_requirement(texts: list[str | None]) -> tuple[int, int] | None:
    """The highest ``go 1.N`` line of the go.mod files a task writes or ships (in its solution's
    heredocs, its build context): the Go its code is written for."""
    found = [(int(a), int(b)) for t in texts if t for a, b in re.findall(r"(?m)^go (\d+)\.(\d+)(?:\.\d+)?\s*$", t)]
    return max(found) if found else None


def host_go_version(candidate=None) -> tuple[int, int] | None:
    """The Go this machine has (``go version``), else the one apt would install (golang-go)."""
    from compactrl.sandbox.local import host_toolchains

    go = shutil.which("go", path=":".join([BASE_PATH, *host_toolchains()[1]]))
    text = ""
    if go:
        try:
            text = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            text = ""
    else:
        text = (candidate or apt_candidate)("golang-go") or ""
    m = re.search(r"(?:go|:)(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass
class _Replay:
    """What :func:`plan` carries from one Dockerfile step to the next: the task's inputs, the plan so far,
    the image's environment at this step, and the facts later steps and the end of the plan read."""

    steps: list[dict]
    files: dict[str, str]
    context: str
    workdir: str | None
    git_mirror: str | None
    out: Plan
    env: dict[str, str] = field(default_factory=lambda: {"PATH": BASE_PATH, "HOME": "/root"})
    apt_why: str | None = None  # the first apt install this machine lacks (reported only if nothing else stops)
    # a top folder a step removes whole (`rm -rf /build`) -> that step's index
    emptied: dict[str, int] = field(default_factory=dict)
    shipped: list[str] | None = None  # a uv project the task ships (`uv sync` installs it)
    uv_project: bool = False  # a project `uv add`/`uv sync` can work in (shipped, or made by `uv init`)

    @property
    def root(self) -> str:
        """The work dir with a trailing slash (``/`` when the image sets none)."""
        return (self.workdir or "").rstrip("/") + "/"


@dataclass
class _RunStep:
    """One ``RUN`` step being replayed: its step, its replayed pieces so far, and what it asks of prepare."""

    step: dict
    pieces: list[str] = field(default_factory=list)
    npm: list = field(default_factory=list)  # its npm installs, fetched at prepare time (:func:`_npm_prefetch`)
    uv_offline: bool = False  # it runs a uv project step offline from the wheelhouse

    def image_needed(self, detail: str) -> str:
        """The reason the task needs its image because of this step, ``detail`` saying why."""
        return f"needs its image: RUN {self.step['command'].strip()[:160]} ({detail})"


def plan(steps: list[dict], files: dict[str, str], context: str, workdir: str | None,
         digest: str, solution_pip: list[str] | tuple[str, ...] = (), git_mirror: str | None = None,
         solution_wheels: list[str] | tuple[str, ...] = (),
         solution_served: dict[str, str] | None = None) -> tuple[Plan | None, str | None]:
    """``(plan, None)``, ``(None, None)`` when nothing needs replaying, or ``(None, "needs its image: ...")``.
    ``solution_wheels``: what the reference solution installs (the wheelhouse); ``solution_served``: the
    installers it fetches that an episode is served offline (:func:`served_installers`).

    The plan is made in three phases: what the test script and reference solution need
    (:func:`_plan_solution_installs`), each Dockerfile step in order (:func:`_plan_step`, the first step
    that cannot be replayed ending it with its reason), and the plan's environment and folders
    (:func:`_plan_finish`)."""
    out = Plan(key=digest)
    _plan_solution_installs(out, solution_pip, solution_wheels, solution_served)
    shipped = uv_project_requirements(files, context)
    state = _Replay(steps=steps, files=files, context=context, workdir=workdir, git_mirror=git_mirror, out=out,
                    shipped=shipped, uv_project=shipped is not None)
    for index, step in enumerate(steps):
        why = _plan_step(state, index, step)
        if why:
            return None, why
    if state.apt_why:
        return None, state.apt_why
    return _plan_finish(state), None


def _plan_solution_installs(out: Plan, solution_pip: list[str] | tuple[str, ...],
                            solution_wheels: list[str] | tuple[str, ...],
                            solution_served: dict[str, str] | None) -> None:
    """Adds to ``out`` what the test script installs (the site folder), what the reference solution installs
    (the wheelhouse) and the installers it fetches (served offline), each with its note in ``out.mapped``."""
    todo = [r for r in solution_pip if not _satisfied(r)]
    if todo:
        out.pip += todo
        out.mapped.append(f"what the test script installs ({' '.join(todo)}): into the task's site folder at prepare "
                          "time (the sandbox has no network)")
    if solution_wheels:
        out.wheelhouse = list(solution_wheels)
        out.mapped.append(f"what the reference solution installs ({' '.join(solution_wheels)}): wheels downloaded at "
                          "prepare time into the task's wheelhouse, which an episode's pip and uv read offline "
                          "(installed only by a policy that installs them)")
    if solution_served:
        out.served = dict(solution_served)
        out.tools += [r for r in solution_served.values() if r not in out.tools]
        out.mapped.append("what the reference solution fetches to install a tool ("
                          + ", ".join(f"{u}: {r}" for u, r in solution_served.items())
                          + "): the tool from PyPI at prepare time; an episode's curl and wget serve the installer "
                          "offline, which installs it where the published one would")


def _plan_step(state: _Replay, index: int, step: dict) -> str | None:
    """Replays one Dockerfile step (number ``index``) into ``state``; the reason the task needs its image
    (or is incomplete) when the step cannot be replayed, else ``None``."""
    op = step["op"]
    if op == "other":
        return f"needs its image: {step['text'][:160]}"
    if op == "missing":
        return (f"the task's files are incomplete: {step['text'][:160]} names nothing in the build context "
                "(its image cannot be built from these files either)")
    if op == "env":
        for name, value in step["vars"].items():
            state.env[name] = _expand(value, state.env)
    elif op == "user":  # the later steps' `~` is that user's home, as in the image
        state.env["HOME"] = step["home"]
    elif op == "copy":
        _plan_copy(state, step)
    elif op == "run":
        return _plan_run(state, index, step)
    return None


def _plan_copy(state: _Replay, step: dict) -> None:
    """A ``COPY``'s destinations outside the work dir, or in it but not among the task's files, become a
    ``copy_out`` step (a copy into a system folder makes the plan build a root layer)."""
    workdir, root, out = state.workdir, state.root, state.out
    outside = [p for p in step["pairs"] if not (workdir and p[1].startswith(root))]
    # a copy into the work dir that a later `RUN rm` removes is not among the task's files (the
    # image's final state lacks it), but the steps between use it (`RUN python3 gen.py` then
    # `RUN rm gen.py`): replayed in its place, and the replayed `rm` removes it
    outside += [p for p in step["pairs"] if workdir and p[1].startswith(root) and p[1][len(root):] not in state.files]
    if any(p[1].strip("/").split("/")[0] in _SYSTEM_TOPS for p in outside):
        out.root_layer = True
    if outside:
        inline = {d: c for d, c in (step.get("inline") or {}).items() if any(d == p[1] for p in outside)}
        out.steps.append({"op": "copy_out", "pairs": outside, **({"inline": inline} if inline else {})})


def _plan_run(state: _Replay, index: int, step: dict) -> str | None:
    """A ``RUN`` step becomes a ``run`` step of its command segment by segment (:func:`_plan_segment`), the
    installers it fetches mapped to served ones first; the first segment's reason the task needs its image,
    else ``None``."""
    out, run = state.out, _RunStep(step)
    command, wheels, notes = map_installers(step["command"])
    out.tools += [w for w in wheels if w not in out.tools]
    out.mapped += notes
    for text, sep in split_segments(command, heredocs=True):
        why = _plan_segment(state, run, index, text, sep)
        if why:
            return why
    out.steps.append({"op": "run", "command": "".join(run.pieces), "workdir": step.get("workdir") or "/",
                      "env": dict(state.env), **({"npm": run.npm} if run.npm else {}),
                      **({"uv_offline": True} if run.uv_offline else {})})
    if run.npm:  # the episode's npm finds that cache where the image's does (its HOME is the work dir)
        state.env["npm_config_cache"] = state.env.get("HOME", "/root").rstrip("/") + "/.npm"
    return None


def _plan_segment(state: _Replay, run: _RunStep, index: int, text: str, sep: str) -> str | None:
    """Adds one command segment of a ``RUN`` step (``sep``: the separator after it) to ``run.pieces`` as it
    is replayed: a release download copied from the downloads, an install done at prepare time replaced by
    ``true``, a removed top folder emptied, anything else as written. The reason the task needs its image
    when the segment cannot be replayed, else ``None``."""
    out = state.out
    release = release_download(text, state.env, run.step.get("workdir") or "/")
    if release:  # the same release from a registry reachable here (tb_downloads), copied in
        run.pieces.append(_plan_release(out, release) + sep)
        return None
    seg = classify(text, state.files, state.context)
    if seg.words[:3] in (["go", "mod", "tidy"], ["go", "mod", "download"]) \
            and _go_std_only(_go_sources(state.steps, state.files, state.context)):
        out.mapped.append(f"{' '.join(seg.words[:3])}: the image's Go code imports the standard library "
                          "only, so it fetches nothing and runs here")
        run.pieces.append(text + sep)
        return None
    if _plan_uv_project(state, seg):
        run.uv_offline = True
        run.pieces.append(text + sep)
        return None
    if seg.action == "image":
        return run.image_needed(seg.detail)
    if seg.action == "apt":
        _plan_apt(state, run, seg)
        text = " true "
    elif seg.action == "pip":
        _plan_pip(out, seg)
        text = " true "
    elif seg.action == "git":
        why = _plan_git(state, run, seg)
        if why:
            return why
    elif seg.action == "script":
        _plan_script(out, seg.detail)
    elif seg.action == "npm":
        # the packages are fetched from the npm registry at prepare time into the image's npm cache
        # ($HOME/.npm); the step itself then runs offline in the sandbox, scripts and all
        run.npm.append(seg.detail)
        out.mapped.append(f"{' '.join(seg.words[:2])}: its packages fetched from the npm registry at "
                          f"prepare time into the npm cache ({state.env.get('HOME', '/root')}/.npm), then run "
                          "offline")
    elif seg.action == "noop":
        text = " true "
    elif tops := _removed_tops(seg.words):
        text = _plan_emptied(state, index, seg.words, tops)
    elif needs_root(seg.words) or re.search(r">\s*/(etc|usr|bin|sbin|lib)\b", text):
        out.root_layer = True
    run.pieces.append(text + sep)
    return None


def _plan_release(out: Plan, release: tuple[str, str]) -> str:
    """A release download (``(url, dest)``) rebuilt at prepare time: the url added to ``out.downloads`` (with
    its note, once), and the command segment that copies it to ``dest`` from the downloads."""
    url, dest = release
    if url not in out.downloads:
        out.downloads.append(url)
        out.mapped.append(f"{url}: the same release rebuilt at prepare time from a registry "
                          "reachable here (tb_downloads)")
    return f" cp {DOWNLOADS_MARK}/{shlex.quote(os.path.basename(url))} {shlex.quote(dest)} "


def _plan_uv_project(state: _Replay, seg: Segment) -> bool:
    """Whether ``seg`` is a step of a uv project of the image's (``uv init``, ``uv add numpy==2.3.1``,
    ``uv sync``) that runs as written, offline from the wheelhouse; if so what it adds or syncs is added to
    the wheelhouse and the site folder. A ``uv init`` makes a project for the later segments."""
    out = state.out
    sub = _uv_subcommand(seg.words)
    state.uv_project = state.uv_project or sub == "init"
    if not (state.uv_project and sub in _UV_PROJECT and uv_project_offline(seg.words)):
        return False
    # a uv project of the image's (`uv init`, `uv add numpy==2.3.1`, `uv sync`): what it adds or
    # syncs comes from the package index at prepare time, like a pip install, into the wheelhouse;
    # the step then runs as written, offline from it, and the state has the image's .venv
    reqs = uv_add_requirements(seg.words) if sub == "add" else (state.shipped or []) if sub == "sync" else []
    out.wheelhouse += [r for r in reqs if r not in out.wheelhouse]
    # the tests run in that project (`uv run pytest`): what it has, the tests see (the site folder)
    out.pip += [r for r in reqs if not _satisfied(r) and r not in out.pip]
    out.mapped.append(f"{' '.join(seg.words[:2])}: run as written, offline from the wheelhouse" + (
        f", its packages ({' '.join(reqs)}) fetched from the package index at prepare time" if reqs
        else ""))
    return True


def _plan_apt(state: _Replay, run: _RunStep, seg: Segment) -> None:
    """An ``apt-get install``: noted as installed on this machine, or, when some of its packages are not, the
    first such reason kept in ``state.apt_why`` (named only when nothing else stops the task: installing
    them would not help then). The segment itself is replaced by ``true`` either way."""
    missing = apt_missing(seg.detail)
    if missing:
        state.apt_why = state.apt_why or run.image_needed(
            f"apt packages not installed on this machine: {' '.join(missing)}{INSTALL_HINT}")
        return
    absent = [p for p in seg.detail if p in SESSION_TOOLS and not host_has_package(p)]
    state.out.mapped.append(f"apt-get install {' '.join(seg.detail)}: installed on this machine" + (
        f" except {' '.join(absent)} (terminal session tools, used by no grader)" if absent else ""))


def _plan_pip(out: Plan, seg: Segment) -> None:
    """A ``pip install``: what the sandbox's Python lacks goes into the task's site folder at prepare time."""
    todo = [r for r in seg.detail if not _satisfied(r)]
    out.pip += [r for r in todo if r not in out.pip]
    out.mapped.append(f"pip install {' '.join(seg.detail)}: " + (
        f"{' '.join(todo)} into the task's site folder at prepare time" if todo
        else "satisfied by the sandbox's Python"))


def _plan_git(state: _Replay, run: _RunStep, seg: Segment) -> str | None:
    """A ``git clone``: each url cloned from its bare mirror under the download cache (``out.git``); the
    reason the task needs its image for the first url without a usable mirror, else ``None``."""
    out = state.out
    for url in seg.detail:
        repo = git_mirror_path(url, state.git_mirror)
        if repo is None:
            return run.image_needed(f"git clone {url}: not reachable here; a bare mirror of it at <download cache>/"
                                    "git/<host>/<owner>/<name>.git, given with `--download-cache DIR` or "
                                    "TerminalBenchConfig.download_cache, is cloned instead")
        problem = git_mirror_problem(repo)
        if problem:
            return run.image_needed(f"git clone {url}: {problem}")
        out.git[url] = {"mirror": repo, "head": _git_head(repo)}
        out.mapped.append(f"git clone {url}: from the mirror {repo} (HEAD {out.git[url]['head'][:12]})")
    return None


def _plan_script(out: Plan, what: dict) -> None:
    """A build script of the task's (:func:`_classify_build_script`) that runs as written: the uv installer it
    fetches served offline, and the uv project it builds from the wheelhouse (and the site folder)."""
    out.served.update(what["served"])
    out.tools += [r for r in what["served"].values() if r not in out.tools]
    out.wheelhouse += [w for w in what["wheels"] if w not in out.wheelhouse]
    # the tests run in that project (`uv run pytest`): what it has, the tests see (the site folder)
    out.pip += [r for r in what["wheels"] if not _satisfied(r) and r not in out.pip]
    out.mapped.append(f"{what['script']}: run as written, " + " and ".join(filter(None, [
        what["served"] and "the uv installer it fetches served offline (" + ", ".join(
            what["served"].values()) + " from PyPI)",
        what["wheels"] and f"the uv project it builds from the wheelhouse ({' '.join(what['wheels'])})"])))


def _plan_emptied(state: _Replay, index: int, words: list[str], tops: list[str]) -> str:
    """The command segment that replays an ``rm -r`` of whole top folders (``tops``, removed by step
    ``index``): the folder is a mount point here (a writable root), so it is emptied instead, and not among
    the episode's folders unless a later step makes it again (:func:`_plan_finish`); the rest of the
    ``rm`` runs as written."""
    rest = [w for w in words[1:] if w.rstrip("/") not in tops]
    state.emptied.update(dict.fromkeys(tops, index))
    return " { " + "".join(f"{shlex.join(['rm', *rest])} && " if any(
        not w.startswith("-") for w in rest) else "") + " && ".join(
        f"find {shlex.quote(t)} -mindepth 1 -delete" for t in tops) + "; } "


def _plan_finish(state: _Replay) -> Plan | None:
    """The plan's environment (the site folder first on ``PYTHONPATH`` when it installs any), its git mirror,
    its task roots and the ones emptied for good; ``None`` when nothing needs replaying."""
    out, env, steps, workdir = state.out, state.env, state.steps, state.workdir
    if out.pip:
        env["PYTHONPATH"] = ":".join(filter(None, ["__SITE__", env.get("PYTHONPATH", "")]))
        # the image's pytest loads the plugins installed with it (e.g. pytest-json-ctrf for --ctrf)
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = ""
    if out.git:
        out.git_mirror = state.git_mirror
    out.env = {k: v for k, v in env.items() if k != "HOME"}
    out.roots = task_roots(steps, workdir)
    gone = {t for t, i in state.emptied.items() if t not in task_roots(steps[i + 1:], None)
            and not (workdir or "").startswith(t.rstrip("/") + "/") and workdir != t}
    out.gone = sorted(r for r in out.roots if r in gone)
    needed = (any(s["op"] in ("run", "copy_out") for s in out.steps) or out.pip or out.wheelhouse or out.served
              or len(out.env) > 1)
    return out if needed else None


def _removed_tops(words: list[str]) -> list[str]:
    """The top folders outside the system ones (``/build``) that an ``rm -r`` removes whole."""
    if not words or words[0] != "rm" or not any(re.match(r"-[a-zA-Z]*[rR]", w) or w == "--recursive" for w in words):
        return []
    tops = [w.rstrip("/") for w in words[1:] if re.fullmatch(r"/[A-Za-z0-9_][A-Za-z0-9_.-]*/?", w)]
    return [t for t in tops if t.strip("/") not in _NOT_TASK_ROOTS]


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


STATE_VERSION = 6
"""Bumped when how a state is built changes, so no state (nor a failure) of an older build is reused."""


def state_dir(task_id: str, build: dict, cache: str | None = None) -> str:
    """``<cache>/<task id>-<key>``: the key covers the Dockerfile, the context, the interpreter and the plan."""
    plan_digest = hashlib.sha256(json.dumps([STATE_VERSION, build], sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join(cache or os.environ.get("COMPACTRL_TB_LOCAL_CACHE") or DEFAULT_CACHE,
                        f"{task_id}-{build['key']}{plan_digest}")


def with_local_state(task, cache: str | None = None):
    """``task`` with its prepared state (``Task.runtime.state``): from the cache, or built now
    without downloads (a task that needs packages fetched must be prepared before its episode: the
    loader with ``prepare=True``, or ``compactrl tasks validate``). A state that cannot be prepared is a
    :class:`~compactrl.sandbox.SandboxError` naming the task, as any infrastructure failure."""
    import dataclasses

    from compactrl.sandbox.base import SandboxError

    try:
        state = prepare(task, cache, allow_download=False)
    except PrepareError as e:
        raise SandboxError(f"task {task.id}: {e}") from None
    return dataclasses.replace(task, runtime=dataclasses.replace(task.runtime, state=state))


def prepare(task, cache: str | None = None, *, allow_download: bool = True, timeout_s: float = 900.0,
            sandbox_options: dict | None = None) -> str:
    """The task's prepared state folder (built now if absent). Raises :class:`PrepareError`."""
    if task.build.error:
        raise PrepareError(task.build.error)
    build = task.build.plan
    dest = state_dir(task.id, build, cache)
    done = os.path.join(dest, "state.json")
    if os.path.isfile(done):
        with open(done) as fh:
            state = json.load(fh)
        if state.get("error"):
            raise PrepareError(state["error"])
        return dest
    if build.get("tools") and not allow_download:
        raise PrepareError(f"needs preparing: {' '.join(build['tools'])} from PyPI (run the loader with prepare=True, "
                           "or `compactrl tasks validate`, before the episode)")
    if build.get("wheelhouse") and not allow_download:
        raise PrepareError(f"needs preparing: the wheelhouse of {' '.join(build['wheelhouse'])} (run the loader with "
                           "prepare=True, or `compactrl tasks validate`, before the episode)")
    if build.get("downloads") and not allow_download:
        from compactrl.tasksets.terminal_bench import downloads as tb_downloads

        if missing := [u for u in build["downloads"] if not tb_downloads.cached(u)]:
            raise PrepareError(f"needs preparing: {missing[0]} (rebuilt from a reachable registry; run the loader "
                               "with prepare=True, or `compactrl tasks validate`, before the episode)")
    if build.get("pip") and not allow_download:
        raise PrepareError(f"needs preparing: pip install {' '.join(build['pip'])} (run the loader with "
                           "prepare=True, or `compactrl tasks validate`, before the episode)")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{task.id}-", dir=os.path.dirname(dest))
    os.chmod(tmp, 0o755)  # the sandbox's unprivileged user reads it (roots.tar, site/)
    started = time.monotonic()
    try:
        root = bool(build.get("root_layer"))
        error = _build(task, build, tmp, timeout_s, sandbox_options or {}, root=root and os.geteuid() == 0)
        if error and _root_would_help(error):
            # a step wrote where only root may (the plan did not see it coming): again, as root
            if os.geteuid() != 0:
                error += " (its steps need root, as the engine runs them: run compactrl as root for a root layer)"
            else:
                shutil.rmtree(tmp)
                os.mkdir(tmp, 0o755)
                error = _build(task, build, tmp, timeout_s, sandbox_options or {}, root=True)
        elif root and os.geteuid() != 0:
            error = ("needs its image: its steps change system files (a root layer needs compactrl to run as root "
                     "here)")
        with open(os.path.join(tmp, "state.json"), "w") as fh:
            json.dump({"task": task.id, "key": build["key"], "error": error,
                       **({"toolchains": build["toolchains"]} if build.get("toolchains") else {}),
                       "seconds": round(time.monotonic() - started, 1), "python": sys.executable}, fh)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if error:
        raise PrepareError(error)
    return dest


def _root_would_help(error: str) -> bool:
    return "failed here" in error and any(m in error for m in ("Read-only file system", "Operation not permitted",
                                                               "Permission denied"))


def _build(task, build: dict, out: str, timeout_s: float, options: dict, root: bool = False) -> str | None:
    """Run the plan into ``out`` (``work/``, ``roots.tar``, ``site/``, and with ``root`` the steps run as
    root with ``layer/`` receiving what they change under the system folders); the failure reason or None."""
    from compactrl.sandbox.local import LocalSandbox
    from compactrl.task import Check, Runtime, Task

    site = os.path.join(out, "site")
    failed = _fetch_packages(task, build, out, site, timeout_s)
    if failed:
        return failed
    outs = [(src, dest, (s.get("inline") or {}).get(dest)) for s in build["steps"] if s["op"] == "copy_out"
            for src, dest in s["pairs"]]
    stage = {f"{STAGE_DIR}/{i}": inline if inline is not None else _read_context(task, src)
             for i, (src, _dest, inline) in enumerate(outs)}
    files = {**task.files, **{k: v for k, v in stage.items() if v is not None}}
    runtime = Runtime(workdir=task.runtime.workdir, env=_site_env(build.get("env") or {}, site),
                      writable_paths=tuple(sorted({*task.runtime.writable_paths, *build.get("roots", ())})))
    box = Task(id=task.id, kind="terminal", instruction="prepare", files=files, check=Check(kind="script", command="true"),
               runtime=runtime)
    layer = os.path.join(out, "layer")
    if root:
        os.mkdir(layer, 0o755)
        options = {**options, "root_layer": layer, "root_layer_writable": True}
    tool_roots = tuple(os.path.dirname(rec["root"]) for rec in build.get("toolchains") or ())
    if build.get("git_mirror"):  # git clone from the mirror (read-only; see git_mirror_env)
        tool_roots += (build["git_mirror"],)
    sandbox = LocalSandbox(**({"file_size_bytes": 16 << 30, "writable_bytes": 4 << 30, "timeout_s": timeout_s,
                               "output_limit_bytes": 16 << 20,
                               "ro_binds": (out, *tool_roots)} | options))
    sandbox.start(box)
    try:
        modes = [shlex.quote(p) for p in task.build.executable_files if p in task.files]
        if modes:  # the modes COPY keeps
            sandbox.exec(f"chmod +x -- {' '.join(modes)}")
        index = 0
        for step in build["steps"]:
            if step["op"] == "copy_out":
                for _src, dest in step["pairs"]:
                    q = shlex.quote(dest)
                    staged = shlex.quote(f"{sandbox._workdir}/{STAGE_DIR}/{index}")
                    mode = " && chmod +x " + q if _context_executable(task, _src) else ""
                    res = sandbox.exec(f"mkdir -p \"$(dirname {q})\" && cp {staged} {q}{mode}")
                    index += 1
                    if res.exit_code != 0:
                        return f"needs its image: COPY to {dest} (cannot be written here: {res.output.strip()[-200:]})"
                continue
            npm_prefix = ""
            for words in step.get("npm") or ():
                failed = _npm_prefetch(sandbox, words, step, out, timeout_s)
                if failed:
                    return f"needs its image: RUN {step['command'].strip()[:160]} ({failed})"
                home = step["env"].get("HOME", "/root")
                npm_prefix = (f"mkdir -p {shlex.quote(home)}/.npm && cp -a {shlex.quote(out)}/npm-cache/. "
                              f"{shlex.quote(home)}/.npm/ && export npm_config_cache={shlex.quote(home)}/.npm "
                              "npm_config_offline=true npm_config_audit=false npm_config_fund=false; ")
            env = _step_env(step, build, out, site)
            exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items() if k != "PATH")
            # the host's toolchains outside the system folders (a Go in /usr/lib/go-1.NN, rustup's cargo) stand
            # for the image's own (golang:1.22 has Go on its PATH): after the image's PATH, as in an episode
            path = ":".join([env.get("PATH", BASE_PATH), *_host_tool_path()])
            command = (f"{exports}{npm_prefix}export PATH={shlex.quote('/opt/compactrl/bin:' + path)}; "
                       f"mkdir -p {shlex.quote(step['workdir'])} 2>/dev/null; cd {shlex.quote(step['workdir'])} && "
                       f"/bin/sh -c {shlex.quote(_marks(step['command'], out))}")
            res = sandbox.exec(command, timeout_s=timeout_s)
            if res.exit_code != 0:
                tail = " | ".join(res.output.strip().splitlines()[-3:])[-300:]
                what = "timed out" if res.timed_out else f"exit {res.exit_code}"
                reached = network_failure(res.output)
                if reached:  # the cause is a download inside the step (a script's fetch): named, not the tail
                    return (f"needs network: RUN {step['command'].strip()[:160]} (failed here: {what}: it fetches from "
                            f"the network, which the sandbox has none of: {reached})")
                return f"needs its image: RUN {step['command'].strip()[:160]} (failed here: {what}: {tail})"
        return _keep_state(sandbox, build, out, timeout_s, root)
    finally:
        sandbox.close()
        if root:
            _finish_layer(layer, sandbox.config.sandbox_uid)


def _fetch_packages(task, build: dict, out: str, site: str, timeout_s: float) -> str | None:
    """What the plan installs from the network, fetched into ``out`` before the steps run: pip's target
    (``site``), the wheelhouse, release downloads, installer tools, served installers; the failure or None."""
    if build.get("pip"):
        os.makedirs(site)
        # wheels only: a requirement with none for this interpreter (numpy 1.21 on Python 3.11) is the
        # image's, not something to compile here for half an hour
        failed = _pip_wheels_into(site, build["pip"], timeout_s, tail_lines=3)
        if failed:
            return (f"needs its image: pip install {' '.join(build['pip'])} ({failed})"
                    + (_python_mismatch(task) if failed.startswith("pip failed") else ""))
    if build.get("wheelhouse"):
        os.makedirs(site, exist_ok=True)  # the episode names the wheelhouse as site/../wheelhouse
        _pip_commands(os.path.join(out, "pybin"))
        failed = _pip_download(os.path.join(out, "wheelhouse"), build["wheelhouse"], timeout_s)
        if failed:
            return (f"needs its image: downloading {' '.join(build['wheelhouse'])} into the wheelhouse ({failed})"
                    + (_python_mismatch(task) if failed.startswith("pip failed") else ""))
    for url in build.get("downloads") or ():  # hard links to the cache (the same file system), or copies
        from compactrl.tasksets.terminal_bench import downloads as tb_downloads

        try:
            got = tb_downloads.fetch(url, timeout_s=timeout_s)
        except tb_downloads.DownloadError as e:
            return f"needs its image: {e}"
        folder = os.path.join(out, "downloads")
        os.makedirs(folder, mode=0o755, exist_ok=True)
        target = os.path.join(folder, os.path.basename(url))
        try:
            os.link(got, target)
        except OSError:
            shutil.copy2(got, target)
    for req in build.get("tools") or ():
        target = os.path.join(out, "tools", req.replace("==", "-"))
        failed = _pip_wheels_into(target, ["--no-deps", req], timeout_s, tail_lines=2)
        if failed:
            return f"needs its image: {req} from PyPI for its installer step ({failed})"
    if build.get("served"):
        os.makedirs(site, exist_ok=True)  # the episode names pybin as site/../pybin
        write_served(os.path.join(out, "pybin"), build["served"])
    return None


def _step_env(step: dict, build: dict, out: str, site: str) -> dict[str, str]:
    """The environment of one ``RUN`` step: the image's, its site folder, the git mirror, a served uv
    installer and the wheelhouse, the toolchains fetched for it."""
    env = _site_env(step["env"], site)
    # git: the work dir is the sandbox user's while root runs the steps (the engine's build owns both),
    # so repositories there are marked safe; clones come from the mirror when there is one
    env = {**env, **git_mirror_env(build.get("git_mirror"))}
    if build.get("served"):  # a build script's uv installer served, its uv project built offline (write_served)
        env = {**env, "PATH": os.path.join(out, "pybin") + ":" + env.get("PATH", BASE_PATH),
               **({"UV_FIND_LINKS": os.path.join(out, "wheelhouse"), "UV_NO_INDEX": "1", "UV_OFFLINE": "1"}
                  if build.get("wheelhouse") else {})}
    if step.get("uv_offline"):  # `uv init`/`uv add`/`uv sync` of the image's project, from the wheelhouse
        env = {**env, "UV_FIND_LINKS": os.path.join(out, "wheelhouse"), "UV_NO_INDEX": "1", "UV_OFFLINE": "1",
               "UV_PYTHON_DOWNLOADS": "never"}
    for rec in build.get("toolchains") or ():  # a newer toolchain from PyPI, first on PATH (tb_toolchains)
        env = {**env, **toolchain_env(rec, step["env"]), "PATH": rec["bin"] + ":" + env.get("PATH", BASE_PATH)}
    return env


def _keep_state(sandbox, build: dict, out: str, timeout_s: float, root: bool) -> str | None:
    """After the steps: the packages' folders made, the system files the solution writes owned as the image
    has them, and what the steps wrote kept in ``out`` (``roots.tar``, ``work/``); the failure or None."""
    if build.get("dirs"):
        res = sandbox.exec("mkdir -p -- " + " ".join(map(shlex.quote, build["dirs"])))
        if res.exit_code != 0:
            return f"needs its image: its packages' folders ({res.output.strip()[-200:]})"
    for path, recursive in build.get("owned") or () if root else ():
        # changing a file's owner in the overlay copies it up into the layer (_finish_layer gives it to the
        # sandbox's user); its owner stays root's until then
        res = sandbox.exec(f"chown {'-R ' if recursive else ''}-h 0:0 -- {shlex.quote(path)}")
        if res.exit_code != 0:
            return f"needs its image: the system files its solution writes ({res.output.strip()[-200:]})"
    _archive_roots(sandbox, timeout_s, [r for r in build.get("roots", ()) if r not in ("/tests", "/logs", "/solution")
                                        and r not in build.get("gone", ())])
    work = os.path.join(sandbox.session_dir, "work")
    tar = os.path.join(work, ROOTS_TAR)
    if os.path.isfile(tar) and os.path.getsize(tar) > 0:
        shutil.move(tar, os.path.join(out, "roots.tar"))
    elif os.path.exists(tar):
        os.remove(tar)
    shutil.copytree(work, os.path.join(out, "work"), symlinks=True)
    shutil.rmtree(os.path.join(out, "npm-cache"), ignore_errors=True)  # in roots.tar now, where the image has it
    shutil.rmtree(os.path.join(out, "downloads"), ignore_errors=True)  # used by the steps; the cache keeps them
    return None


def _marks(command: str, out: str) -> str:
    """A step's command with the state's folders in place of :data:`TOOLS_MARK` and :data:`DOWNLOADS_MARK`."""
    return command.replace(TOOLS_MARK, os.path.join(out, "tools")).replace(DOWNLOADS_MARK, os.path.join(out, "downloads"))


def _host_tool_path() -> list[str]:
    from compactrl.sandbox.local import host_toolchains

    return host_toolchains()[1]


def _finish_layer(layer: str, owner: int = 65534) -> None:
    """Drop overlayfs's work folders and empty system folders; no layer at all when nothing changed.
    What is left belongs to the sandbox's uid: the image's agent is root and may change or remove what
    the steps put there (``rm /etc/service_config.ini``); the local sandbox's shell is that uid."""
    shutil.rmtree(os.path.join(layer, ".work"), ignore_errors=True)
    for dirpath, dirnames, filenames in os.walk(layer):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), owner, owner)
    for name in os.listdir(layer) if os.path.isdir(layer) else ():
        path = os.path.join(layer, name)
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)
    if os.path.isdir(layer) and not os.listdir(layer):
        os.rmdir(layer)


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
    # what lies in a folder leading to one of the sandbox's mounts (``/root/.cache/uv`` beside the state's
    # mount under ``/root/.cache``) is left out: that folder is the sandbox's own (root's) in an episode,
    # so nothing can be restored into it; it holds tools' caches
    inner = blocked - {p.strip("/") for p in roots}
    # util-linux's own record of the sandbox's mounts (``/run/mount/utab``) is not the steps'
    entries = [e for e in entries_text.splitlines() if e and e not in blocked and e.split("/")[:2] != ["run", "mount"]
               and not any(e.startswith(m + "/") for m in mounts)
               and not any("/".join(e.split("/")[:k]) in inner for k in range(1, e.count("/") + 1))]
    if not entries:
        return
    sandbox.write_file(f"{STAGE_DIR}.list", "\n".join(entries) + "\n")
    res = sandbox.exec(f"cd / && tar -cf {shlex.quote(work)}/{ROOTS_TAR} --no-recursion -T {shlex.quote(work)}/"
                       f"{STAGE_DIR}.list 2>&1; rm -f {shlex.quote(work)}/{STAGE_DIR}.list", timeout_s=timeout_s)
    if res.exit_code != 0:
        raise PrepareError(f"archiving what the Dockerfile's steps wrote outside the work dir failed: {res.output[-300:]}")


_NPM_PACKAGE_FILES = ("package.json", "package-lock.json", "npm-shrinkwrap.json", ".npmrc")


def _npm_prefetch(sandbox, words: list[str], step: dict, out: str, timeout_s: float) -> str | None:
    """Fetch what an ``npm ci`` / ``npm install`` step installs from the npm registry into
    ``<out>/npm-cache`` (the host has the network at prepare time, the sandbox never): the same npm
    command run on the host in a scratch folder holding the step's package files (taken from its
    folder in the sandbox as the build left them), with ``--ignore-scripts`` and the cache given.
    The step then runs in the sandbox offline from that cache. Why it failed, or None."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed on this machine"
    stage = f"{sandbox._workdir}/{STAGE_DIR}.npm.tar"
    args, i, prefix = [], 1, None
    while i < len(words):  # --prefix DIR: the packages' folder (a scratch one here)
        w = words[i]
        if w in ("--prefix", "-C") and i + 1 < len(words):
            prefix, i = words[i + 1], i + 2
            continue
        if w.startswith("--prefix="):
            prefix = w.split("=", 1)[1]
        else:
            args.append(w)
        i += 1
    folder = prefix if prefix and prefix.startswith("/") else posixpath_join(step["workdir"], prefix or ".")
    names = " ".join(shlex.quote(n) for n in _NPM_PACKAGE_FILES)
    res = sandbox.exec(f"cd {shlex.quote(folder)} 2>/dev/null && tar -cf {shlex.quote(stage)} $(ls -d {names} "
                       f"2>/dev/null) 2>&1 || tar -cf {shlex.quote(stage)} -T /dev/null", timeout_s=60)
    host_tar = os.path.join(sandbox.session_dir, "work", STAGE_DIR + ".npm.tar")
    scratch = tempfile.mkdtemp(prefix="compactrl-npm-")
    try:
        if os.path.isfile(host_tar):
            with tarfile.open(host_tar) as tf:
                tf.extractall(scratch, filter="data")
            os.remove(host_tar)
        cmd = [npm, *args, "--prefix", scratch, "--cache", os.path.join(out, "npm-cache"), "--ignore-scripts",
               "--no-audit", "--no-fund", "--no-update-notifier"]
        try:
            res = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=timeout_s,
                                 env={**os.environ, "npm_config_offline": "false"})
        except subprocess.TimeoutExpired:
            return f"npm {' '.join(args)} from the registry timed out after {timeout_s:g}s"
        if res.returncode != 0:
            tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-3:])[-300:]
            return f"npm {' '.join(args)} from the registry failed here: {tail}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # the sandbox's user reads the cache (it is copied into the image's $HOME/.npm there)
    for dirpath, _dirs, files in os.walk(os.path.join(out, "npm-cache")):
        os.chmod(dirpath, 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return None


def posixpath_join(base: str, rel: str) -> str:
    import posixpath

    return posixpath.normpath(posixpath.join(base or "/", rel))


def toolchain_env(rec: dict, image_env: dict[str, str]) -> dict[str, str]:
    from compactrl.tasksets.terminal_bench.toolchains import sandbox_env

    return sandbox_env(rec, image_env)


def _site_env(env: dict[str, str], site: str) -> dict[str, str]:
    return {k: v.replace("__SITE__", site) for k, v in env.items()}


# pip's words for a requirement it found no distribution of (with --only-binary: no wheel)
_NO_DISTRIBUTION = re.compile(r"(?:satisfies the requirement|No matching distribution found for) ([A-Za-z0-9][\w.-]*)"
                              r"(?:\[[^\]]*\])?(==[\w.+!-]+)?")


def _pip_wheels(verb: str, args: list[str], timeout_s: float, tail_lines: int) -> str | None:
    """``pip <verb>`` of wheels (``--only-binary=:all:``); ``None`` when it worked, else why not:
    ``"timed out after Ns"`` or ``"pip failed here: <last lines>"``. A package with no wheel at all
    (only a source distribution, as many older pure-Python releases: ``construct==2.10.68``) is then
    taken from its source (``--no-binary=<name>``, one package at a time, at most 5), as the image's pip
    would build it; a package that has wheels but none for this interpreter still fails (numpy 1.21 on
    Python 3.11 is the image's, not something to compile here for half an hour)."""
    sources: list[str] = []
    while True:
        cmd = [sys.executable, "-m", "pip", verb, "--no-input", "--disable-pip-version-check", "--quiet",
               "--only-binary=:all:", *(f"--no-binary={name}" for name in sources), *args]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:g}s"
        if res.returncode == 0:
            return None
        output = res.stdout + res.stderr
        missing = _NO_DISTRIBUTION.search(output)
        name = missing.group(1) if missing else None
        # the release named: pinned in the arguments, or by a dependency's metadata (pip prints the pin)
        pinned = [*args, name + missing.group(2)] if missing and missing.group(2) else args
        if name is None or name in sources or len(sources) >= 5 or not _sdist_only(name, pinned):
            tail = output.strip().splitlines()[-tail_lines:]
            return f"pip failed here: {' | '.join(tail)[-300:]}"
        sources.append(name)


def _sdist_only(name: str, args: list[str]) -> bool:
    """Whether the release of ``name`` pinned in ``args`` (``name==V``) is published as a source
    distribution only (PyPI's JSON API: no wheel among its files)."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    pins = [a.split("==", 1)[1].strip() for a in args
            if "==" in a and re.sub(r"[-_.]+", "-", re.split(r"[=<>!~\[ ;]", a, maxsplit=1)[0]).lower() == key]
    if not pins:
        return False
    kinds = pypi_file_kinds(name, pins[0])
    return bool(kinds) and kinds <= {"sdist"}


def pypi_file_kinds(name: str, version: str, timeout_s: float = 30.0) -> set[str]:
    """The kinds (``sdist``, ``wheel``) of a release's files on PyPI (its simple index, JSON form of
    PEP 691); empty when unknown."""
    import urllib.error
    import urllib.request

    project = re.sub(r"[-_.]+", "-", name).lower()
    request = urllib.request.Request(f"https://pypi.org/simple/{project}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError):
        return set()
    stem = re.sub(r"[-_.]+", "_", project)
    kinds = set()
    for f in data.get("files") or ():
        filename = re.sub(r"[-_.]+", "_", str(f.get("filename", "")).lower())
        if filename.startswith(f"{stem}_{re.sub(r'[-_.]+', '_', version.lower())}_") or \
                filename in (f"{stem}_{re.sub(r'[-_.]+', '_', version.lower())}_tar_gz",):
            kinds.add("wheel" if str(f.get("filename")).endswith(".whl") else "sdist")
    return kinds


def _pip_wheels_into(target: str, args: list[str], timeout_s: float, tail_lines: int) -> str | None:
    """``pip install`` wheels only into ``target``; None, or why not (as :func:`_pip_wheels`)."""
    return _pip_wheels("install", ["--target", target, *args], timeout_s, tail_lines)


def _pip_download(dest: str, reqs: list[str], timeout_s: float) -> str | None:
    """``pip download`` wheels only of ``reqs`` and their dependencies for the sandbox's interpreter into
    ``dest`` (made readable by the sandbox's user); None, or why not (as :func:`_pip_wheels`)."""
    why = _pip_wheels("download", ["-d", dest, *reqs], timeout_s, 3)
    if why is not None:
        return why
    # a release published as source only (see _pip_wheels) becomes a wheel here, where its build tools can
    # be fetched: the episode's pip installs from the wheelhouse with no index
    for name in sorted(os.listdir(dest)):
        if name.endswith((".tar.gz", ".zip", ".tar.bz2")):
            sdist = os.path.join(dest, name)
            project = re.match(r"(.+?)-\d", name)
            why = _pip_wheels("wheel", ["--no-deps", f"--no-binary={project.group(1) if project else ':all:'}", "-w",
                                        dest, sdist], timeout_s, 3)
            if why is not None:
                return f"building {name}: {why}"
            os.remove(sdist)
    os.chmod(dest, 0o755)
    for name in os.listdir(dest):
        os.chmod(os.path.join(dest, name), 0o644)
    return None


def _pip_commands(folder: str) -> None:
    """``pip``, ``pip3`` and ``pip3.X`` that run the sandbox's own interpreter's pip (``python3 -m pip``),
    as an image's ``pip`` is its Python's; the host's ``/usr/bin/pip`` belongs to another interpreter
    (Debian's 3.11.2, for which the wheelhouse's resolution differs: soupsieve needs >= 3.11.5)."""
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o755)
    for name in ("pip", "pip3", f"pip{sys.version_info[0]}.{sys.version_info[1]}"):
        path = os.path.join(folder, name)
        with open(path, "w") as fh:
            fh.write('#!/bin/sh\nexec python3 -m pip "$@"\n')
        os.chmod(path, 0o755)


_SERVE = r'''
"""curl and wget as the machine's, except for the installer URLs in served.json beside this file: those are
answered offline from the task's prepared state (compactrl's Terminal-Bench local backend)."""
import json, os, sys

here = os.path.dirname(os.path.realpath(__file__))
name, args = sys.argv[1], sys.argv[2:]
with open(os.path.join(here, "served.json")) as fh:
    served = json.load(fh)
url = next((a for a in args if a in served), None)
if url is None:
    for d in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(d or ".", name)
        if d and os.path.realpath(d) != here and os.access(path, os.X_OK) and not os.path.isdir(path):
            os.execv(path, [name, *args])
    print(f"{name}: command not found", file=sys.stderr)
    sys.exit(127)
tool = served[url]
body = open(os.path.join(here, "served", tool.replace("==", "-") + ".sh")).read()
body = body.replace("__TOOLS__", os.path.join(os.path.dirname(here), "tools"))
out = None  # curl writes to stdout unless told; wget to the URL's file name
if name == "wget":
    out = os.path.basename(url)
for i, a in enumerate(args):
    nxt = args[i + 1] if i + 1 < len(args) else None
    if name == "curl" and a in ("-o", "--output"):
        out = nxt
    elif name == "curl" and a in ("-O", "--remote-name"):
        out = os.path.basename(url)
    elif name == "curl" and a.startswith("-") and not a.startswith("--") and "o" in a[1:]:
        out = a[a.index("o", 1) + 1:] or nxt
    elif name == "curl" and a.startswith("-") and not a.startswith("--") and "O" in a[1:]:
        out = os.path.basename(url)
    elif name == "wget" and a.startswith("--output-document"):
        out = a.split("=", 1)[1] if "=" in a else nxt
    elif name == "wget" and a.startswith("-") and not a.startswith("--") and "O" in a[1:]:
        out = a[a.index("O", 1) + 1:] or nxt
if out in (None, "-"):
    sys.stdout.write(body)
else:
    with open(out, "w") as fh:
        fh.write(body)
'''


def write_served(folder: str, served: dict[str, str]) -> None:
    """``curl`` and ``wget`` in ``folder`` (first on an episode's ``PATH``) that answer the installer URLs of
    ``served`` (:attr:`Plan.served`) with an installer doing what the published one does from the tool
    prepared under the state's ``tools/`` (:func:`_uv_install`), offline; any other call runs the
    machine's own ``curl``/``wget``, which has no network in the sandbox."""
    os.makedirs(os.path.join(folder, "served"), exist_ok=True)
    os.chmod(folder, 0o755)
    with open(os.path.join(folder, "served.json"), "w") as fh:
        json.dump(served, fh, indent=1)
    with open(os.path.join(folder, "serve.py"), "w") as fh:
        fh.write(_SERVE.lstrip())
    for req in set(served.values()):
        tool = req.replace("==", "-")
        with open(os.path.join(folder, "served", tool + ".sh"), "w") as fh:
            fh.write(f"#!/bin/sh\n# astral.sh's uv installer, served offline: {req} from PyPI, installed where the "
                     f"published installer installs it\n{_uv_install(req.partition('==')[2] or None, f'{TOOLS_MARK}/{tool}/bin')}"
                     " && echo 'everything is installed!'\n")
    for name in ("curl", "wget"):
        path = os.path.join(folder, name)
        with open(path, "w") as fh:
            fh.write(f'#!/bin/sh\nexec python3 -I "$(dirname "$0")/serve.py" {name} "$@"\n')
        os.chmod(path, 0o755)


# Where an episode's `pip install` puts what it installs from the wheelhouse (the sandbox's interpreter is
# read-only; the image's root installs into its site-packages): a private writable folder on PYTHONPATH.
PIP_TARGET = "/opt/.pip-target"


def wheelhouse_env(env: dict[str, str]) -> dict[str, str]:
    """An episode's variables for a task with a wheelhouse (``<state>/wheelhouse``, written ``__SITE__/../
    wheelhouse`` as the site folder's sibling): pip and uv read it and no index (``PIP_FIND_LINKS`` +
    ``PIP_NO_INDEX``, ``UV_FIND_LINKS`` + ``UV_NO_INDEX`` + ``UV_OFFLINE``); pip installs into
    :data:`PIP_TARGET`, which is on ``PYTHONPATH`` and whose ``bin`` is on ``PATH``."""
    house = "__SITE__/../wheelhouse"
    return {"PIP_FIND_LINKS": house, "PIP_NO_INDEX": "1", "PIP_TARGET": PIP_TARGET,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_FIND_LINKS": house, "UV_NO_INDEX": "1", "UV_OFFLINE": "1",
            "PYTHONPATH": ":".join(filter(None, [PIP_TARGET, env.get("PYTHONPATH", "")])),
            "PATH": f"__SITE__/../pybin:{PIP_TARGET}/bin:" + env.get("PATH", BASE_PATH)}


def _python_mismatch(task) -> str:
    """`` (its image's Python is 3.8, the sandbox's 3.11)`` when the Dockerfile's base is another Python."""
    path = task.runtime.image_build.dockerfile if task.runtime.image_build else ""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            m = re.search(r"(?im)^FROM\s+(?:\S+/)?python:(\d+\.\d+)", fh.read())
    except OSError:
        return ""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return f" (its image's Python is {m.group(1)}, the sandbox's {here})" if m and m.group(1) != here else ""


def _context_executable(task, src: str) -> bool:
    path = os.path.join(task.runtime.image_build.context if task.runtime.image_build else "", src)
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _read_context(task, src: str) -> str | None:
    path = os.path.join(task.runtime.image_build.context if task.runtime.image_build else "", src)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="surrogateescape")


_UV_ENV_SOURCE = re.compile(r"""^\s*(?:source|\.)\s+["']?(?:\$HOME|\$\{HOME\}|~|/root)/\.local/bin/env["']?\s*$""")


def offline_installs(script: str) -> str:
    """A test script with the installs the local backend has already done made no-ops, so the script
    itself runs offline: ``apt-get update``, an ``apt-get install`` of packages this machine has,
    ``pip``/``uv pip install`` (what a test script installs is installed at prepare time), astral.sh's
    uv installer piped to a shell and the ``source $HOME/.local/bin/env`` after it (its ``uvx ... pytest``
    runs as ``python3 -m pytest``: :func:`~compactrl.tasksets.terminal_bench.folders.offline_uvx`). Whatever
    else fetches stays, and still counts as network. Here-document bodies are left as they are."""
    out, heredoc = [], None
    for chunk in re.findall(r"(?:[^\n]*\\\n)*[^\n]*\n?", script):
        if not chunk:
            continue
        if heredoc is not None:
            out.append(chunk)
            if chunk.strip() == heredoc:
                heredoc = None
            continue
        end = "\n" if chunk.endswith("\n") else ""
        logical = re.sub(r"\\\r?\n", " ", chunk[:len(chunk) - len(end)])
        marker = HEREDOC.search(logical)
        if marker:
            heredoc = marker.group(3)
        if logical.lstrip().startswith("#") or marker:
            out.append(chunk)
            continue
        if _UV_ENV_SOURCE.match(logical):
            out.append("true" + end)
            continue
        line = _UV_INSTALLER.sub(" true ", logical)
        pieces, changed = [], line != logical
        for text, sep in split_segments(line):
            seg = classify(text, {}, "")
            name = os.path.basename(seg.words[0]) if seg.words else ""
            done = (seg.action == "pip"
                    or (seg.action == "apt" and not apt_missing(seg.detail))
                    or (seg.action == "noop" and name in _APT))
            pieces.append((" true " if done else text) + sep)
            changed = changed or done
        out.append(("".join(pieces) if changed else chunk[:len(chunk) - len(end)]) + end)
    return "".join(out)

