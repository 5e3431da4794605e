"""What a Terminal-Bench task's Dockerfile does, as far as a sandbox without the image can honour it.

:func:`read_dockerfile` walks the last build stage's instructions and returns the image's work dir
(an explicit ``WORKDIR``, or one inherited from a Terminal-Bench base image), every ``COPY``/``ADD``
of build-context files with its absolute destination, the paths that ``RUN rm`` removes, and one
reason per step that only a built image honours (package installs, downloads, services, copies
from other stages, destinations outside the work dir).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import posixpath
import re
import shlex
from dataclasses import dataclass, field

from compactrl.sandbox.shell_syntax import HEREDOC

INLINE = "<inline>"
"""Source prefix of a copy whose content is a Dockerfile heredoc (``DockerfileFacts.inline``)."""
# Terminal-Bench's base images (``ghcr.io/laude-institute/t-bench/<name>:<date>``) set WORKDIR /app.
KNOWN_BASE_WORKDIRS = {"ghcr.io/laude-institute/t-bench/": "/app"}
# Commands a RUN step may hold that need packages, the network or a running service.
_NEEDS_IMAGE = re.compile(r"\b(apt-get|apt|apk|yum|dnf|pip3?|uv|npm|yarn|cargo|go|gem|curl|wget|git clone|"
                          r"service|systemctl|conda|make)\b")


@dataclass
class DockerfileFacts:
    """The honourable effects of one Dockerfile (all paths absolute, in the image)."""

    workdir: str | None = None
    workdir_source: str = "none"
    copies: list[tuple[str, str]] = field(default_factory=list)
    """``(context-relative source path, absolute destination file)``, in build order."""
    removed: list[str] = field(default_factory=list)
    """Paths ``RUN rm`` removes; the copies before it that they hit are already dropped."""
    image_only: list[str] = field(default_factory=list)
    """Steps only a built image honours, one reason each."""
    missing: list[str] = field(default_factory=list)
    """``COPY`` sources that match nothing in the build context (the engine's build fails on them too:
    a copy of the task without a large file, say)."""
    inline: dict[str, str] = field(default_factory=dict)
    """``COPY <<EOT /dest`` heredocs: absolute destination -> content (their copies' source is
    :data:`INLINE` + the destination)."""
    user: str | None = None
    """The last ``USER`` of the last stage (None: the base image's, root for every base here)."""
    home: str = "/root"
    """The image's user's home: ``/root`` for root, else the one its ``useradd -d``/``adduser --home`` gave,
    else ``/home/<name>`` (useradd's and adduser's default). The reference solution, the agent and the
    verifier all run as that user in the image, so they share it."""
    steps: list[dict] = field(default_factory=list)
    """The last stage's steps in build order, for the local backend to replay
    (:mod:`~compactrl.tasksets.terminal_bench.local_build`): ``{"op": "workdir", "path"}``, ``{"op": "env",
    "vars"}`` (values as written), ``{"op": "copy", "pairs": [[src, dest], ...]}``, ``{"op": "run",
    "command", "workdir"}``, ``{"op": "user", "name", "home"}``, ``{"op": "other", "text"}`` (an instruction the local backend does not
    replay: ``COPY --from``, ``ADD`` of a URL)."""




def _instructions(text: str) -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` pairs, continuation lines joined, comments dropped. A heredoc
    (``COPY <<EOT /app/x`` or ``RUN <<EOF``, BuildKit's syntax) keeps its body in the arguments,
    after a newline: ``("COPY", "<<EOT /app/x\n<body>")``. A ``RUN`` whose command reads a heredoc
    (``RUN cat > /app/main.go << 'GO'``) keeps each terminator too: BuildKit runs the command with its
    heredocs, as a shell script, ``("RUN", "cat > /app/main.go << 'GO'\n<body>\nGO")``."""
    out, current = [], ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not current and line.lstrip().startswith("#"):
            continue
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            keyword, _, rest = current.strip().partition(" ")
            rest = rest.strip()
            for m in HEREDOC.finditer(rest) if keyword.upper() in ("COPY", "ADD", "RUN") else ():
                body = []
                while i < len(lines) and (lines[i].lstrip("\t") if m.group(1) else lines[i]) != m.group(3):
                    body.append(lines[i].lstrip("\t") if m.group(1) else lines[i])
                    i += 1
                i += 1  # the terminator
                rest += "\n" + "\n".join(body)
                if keyword.upper() == "RUN" and not re.match(r"\d*<<", rest):
                    rest += "\n" + m.group(3)
            out.append((keyword.upper(), rest))
        current = ""
    return out


def _last_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (k, _) in enumerate(steps) if k == "FROM"]
    return steps[starts[-1]:] if starts else steps


def _copy_args(rest: str) -> tuple[list[str], str | None]:
    """Sources and destination of ``COPY``/``ADD``; ``--from`` gives no context sources."""
    if rest.startswith("["):
        words = json.loads(rest)
    else:
        words = shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    words = [w for w in words if not w.startswith("--")]
    if any(f.startswith("--from") for f in flags) or len(words) < 2:
        return [], None
    return words[:-1], words[-1]


def _expand(context: str, src: str, dest: str, many: bool) -> list[tuple[str, str]]:
    """Context files a source names, each with its destination (Docker's COPY rules)."""
    src = posixpath.normpath(src).strip("/") if src not in (".", "./") else ""
    full = os.path.join(context, src)
    if os.path.isdir(full):
        pairs = []
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames.sort()
            for name in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, name), full).replace(os.sep, "/")
                pairs.append((posixpath.join(src, rel) if src else rel, posixpath.join(dest, rel)))
        return pairs
    matches = sorted(glob.glob(full)) if any(c in src for c in "*?[") else ([full] if os.path.isfile(full) else [])
    to_dir = many or dest.endswith("/") or len(matches) > 1
    return [(os.path.relpath(m, context).replace(os.sep, "/"),
             posixpath.join(dest, os.path.basename(m)) if to_dir else dest) for m in matches]


def _rm_paths(command: str, workdir: str) -> list[str]:
    """Absolute paths of every ``rm`` in a RUN command (split at ``&&``, ``;``, ``||``)."""
    out = []
    for part in re.split(r"&&|\|\||;", command):
        try:
            words = shlex.split(part)
        except ValueError:
            continue
        if words and words[0] == "rm":
            out += [posixpath.normpath(posixpath.join(workdir, w)) for w in words[1:] if not w.startswith("-")]
    return out


def read_dockerfile(path: str, context: str) -> DockerfileFacts:
    """The facts of the Dockerfile at ``path`` whose build context is the folder ``context``."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        steps = _last_stage(_instructions(fh.read()))
    facts, workdir = DockerfileFacts(), "/"
    for keyword, rest in steps:
        if keyword == "FROM":
            base = rest.split()[0] if rest else ""
            for prefix, inherited in KNOWN_BASE_WORKDIRS.items():
                if base.startswith(prefix):
                    workdir, facts.workdir, facts.workdir_source = inherited, inherited, f"inherited from {base}"
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, rest.strip().strip('"')))
            facts.workdir, facts.workdir_source = workdir, "WORKDIR"
            facts.steps.append({"op": "workdir", "path": workdir})
        elif keyword == "ENV":
            facts.steps.append({"op": "env", "vars": _env_pairs(rest)})
        elif keyword == "USER":
            name = rest.strip().strip('"').split(":")[0]
            runs = [s["command"] for s in facts.steps if s["op"] == "run"]
            facts.user, facts.home = name, user_home(name, runs)
            facts.steps.append({"op": "user", "name": name, "home": facts.home})
        elif keyword in ("COPY", "ADD"):
            before = len(facts.copies), len(facts.image_only), len(facts.missing)
            _copy(facts, context, rest, workdir, keyword)
            if len(facts.image_only) > before[1]:
                facts.steps.append({"op": "other", "text": f"{keyword} {rest[:200]}"})
            for src in facts.missing[before[2]:]:
                facts.steps.append({"op": "missing", "text": f"{keyword} {src}"})
            pairs = [list(p) for p in facts.copies[before[0]:]]
            step = {"op": "copy", "pairs": pairs}
            inline = {d: facts.inline[d] for src, d in pairs if src.startswith(INLINE)}
            if inline:
                step["inline"] = inline
            facts.steps.append(step)
        elif keyword == "RUN":
            facts.steps.append({"op": "run", "command": _run_text(rest), "workdir": workdir})
            _remove(facts, _rm_paths(rest, workdir))
            needs = sorted(set(_NEEDS_IMAGE.findall(rest)))
            if needs:
                facts.image_only.append(f"RUN {' '.join(needs)} (packages, network or a service): {rest[:80]}")
    return facts


_USER_ADDERS = ("useradd", "adduser")


def user_home(name: str, commands: list[str]) -> str:
    """The home of the image's user ``name``: ``/root`` for root, else the ``-d``/``--home-dir``/``--home``
    that a ``useradd``/``adduser`` of it in ``commands`` gave, else ``/home/<name>`` (both tools' default)."""
    if name in ("root", "0", ""):
        return "/root"
    home = f"/home/{name}"
    for command in commands:
        for part in re.split(r"&&|\|\||;|\n", command):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            if not words or posixpath.basename(words[0]) not in _USER_ADDERS or words[-1] != name:
                continue
            for i, word in enumerate(words[:-1]):
                if word in ("-d", "--home-dir", "--home") and i + 1 < len(words) - 1:
                    home = words[i + 1]
                elif word.startswith(("--home-dir=", "--home=")):
                    home = word.split("=", 1)[1]
    return home


def _env_pairs(rest: str) -> dict[str, str]:
    """``ENV A=1 B="two words"`` or the older ``ENV NAME value with spaces``, values as written
    (quotes removed, ``$VAR`` kept for expansion)."""
    first = rest.split(None, 1)
    if first and "=" not in first[0]:
        return {first[0]: first[1].strip() if len(first) > 1 else ""}
    try:
        words = shlex.split(rest.replace("$", "\x00"), posix=True)  # keep "$X" literal through shlex
    except ValueError:
        words = rest.split()
    out = {}
    for word in words:
        name, _, value = word.replace("\x00", "$").partition("=")
        if name:
            out[name] = value
    return out


def _run_text(rest: str) -> str:
    """A RUN's shell text (the exec form ``["a", "b"]`` as a quoted command line; a heredoc's body as
    the script ``RUN <<EOF`` runs)."""
    if rest.startswith("<<"):
        return rest.partition("\n")[2]
    if rest.startswith("["):
        try:
            return shlex.join(json.loads(rest))
        except (ValueError, TypeError):
            pass
    return rest


def _remove(facts: DockerfileFacts, paths: list[str]) -> None:
    """Drop the copies a ``RUN rm`` deletes (the path itself, a glob, or anything under it)."""
    facts.removed += paths
    facts.copies = [(src, dest) for src, dest in facts.copies
                    if not any(dest == p or dest.startswith(p.rstrip("/") + "/") or fnmatch.fnmatchcase(dest, p)
                               for p in paths)]


def _copy(facts: DockerfileFacts, context: str, rest: str, workdir: str, keyword: str) -> None:
    if rest.startswith("<<"):  # COPY <<EOT /dest: the file's content is the heredoc's body
        head, _, body = rest.partition("\n")
        words = [w for w in head.split() if not w.startswith("--")]
        dest = posixpath.normpath(posixpath.join(workdir, words[-1])) if len(words) >= 2 else None
        if dest is None:
            facts.image_only.append(f"{keyword} {head[:80]} (unreadable heredoc)")
            return
        facts.inline[dest] = body + "\n"
        facts.copies.append((INLINE + dest, dest))
        return
    try:
        sources, dest = _copy_args(rest)
    except ValueError:
        sources, dest = [], None
    if dest is None:
        facts.image_only.append(f"{keyword} {rest[:80]} (from another stage or unreadable)")
        return
    absolute = posixpath.normpath(posixpath.join(workdir, dest))
    # a destination that is a folder of the image (the work dir or one above it: `COPY data.txt /app`)
    # receives the file inside it, as the engine does
    is_dir = dest.endswith("/") or dest in (".", "./") or workdir == absolute or workdir.startswith(absolute + "/")
    absolute += "/" if is_dir and absolute != "/" else ""
    for src in sources:
        if src.startswith(("http://", "https://")):
            facts.image_only.append(f"{keyword} {src} (a download)")
            continue
        found = _expand(context, src, absolute, len(sources) > 1)
        if not found:
            facts.missing.append(src)
        facts.copies += found
