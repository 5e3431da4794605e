# ruff: noqa: UP031
"""SWE-bench's grading, as the official harness does it: per-repository log parsers and the verdict.

Test ids are normalised exactly as ``swebench.harness.log_parsers`` records them (pytest's id cut
at the first space; ``[/abs/path/x]`` parameters shortened to ``[/x]`` for pydicom, requests and
pylint; whole lines for astropy, scikit-learn and sphinx; django's and sympy's own runners), and a
row is resolved as ``swebench.harness.grading`` resolves it: every FAIL_TO_PASS test PASSED or
XFAIL; every PASS_TO_PASS test PASSED, XFAIL or SKIPPED; a missing test fails.

This file is also the grading script of a SWE-bench task: it is written into the sandbox as a
hidden file and run by the repository's own interpreter, so it uses the standard library only and
the syntax of Python 3.6 (no annotations, no f-strings; older interpreters are not supported).
``python swebench_grading.py SPEC LOG`` prints the log, then a pytest-style summary of the
required tests, then the verdict; it exits 0 iff the row is resolved.
"""

import json
import re
import sys

STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
"""``swebench.harness.constants.TestStatus``, in its order."""
_SKIP_COUNT = re.compile(r"^\[\d+\]$")


def _is_skip_summary(status, name):
    # pytest's "SKIPPED [N] path:line: reason": the [N] is not a test id
    return status == "SKIPPED" and bool(_SKIP_COUNT.match(name))


def _status_of(line):
    for status in STATUSES:
        if line.startswith(status):
            return status
    return None


def _summary_pairs(log):
    """``(status, test id)`` of each ``-rA`` summary line, the id being its second whitespace-separated word."""
    for line in log.split("\n"):
        if _status_of(line) is None:
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        words = line.split()
        if len(words) <= 1 or _is_skip_summary(words[0], words[1]):
            continue
        yield words[0], words[1]


def parse_log_pytest(log):
    """``-rA`` summary lines; the id is the second whitespace-separated word."""
    return {name: status for status, name in _summary_pairs(log)}


_OPTION = re.compile(r"(.*?)\[(.*)\]")


def parse_log_pytest_options(log):
    """As :func:`parse_log_pytest`, with an absolute-path parameter cut to its base name."""
    status_map = {}
    for status, name in _summary_pairs(log):
        match = _OPTION.search(name)
        if match:
            main, option = match.groups()
            if option.startswith("/") and not option.startswith("//") and "*" not in option:
                option = "/" + option.split("/")[-1]
            name = "%s[%s]" % (main, option)
        status_map[name] = status
    return status_map


_ESCAPES = "".join(chr(c) for c in range(1, 32))


def parse_log_pytest_v2(log):
    """Colour codes removed; the id is the rest of the line (a FAILED line's message dropped)."""
    status_map = {}
    table = str.maketrans("", "", _ESCAPES)
    for line in log.split("\n"):
        line = re.sub(r"\[(\d+)m", "", line).translate(table)
        if _status_of(line) is not None:
            if line.startswith("FAILED"):
                line = line.split(" - ", 1)[0]
            words = line.split()
            if len(words) >= 2 and not _is_skip_summary(words[0], words[1]):
                status_map[" ".join(words[1:])] = words[0]
        elif any(line.endswith(s) for s in STATUSES):
            words = line.split()
            if len(words) >= 2:
                status_map[" ".join(words[:-1])] = words[-1]
    return status_map


def parse_log_matplotlib(log):
    return parse_log_pytest(log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


def parse_log_seaborn(log):
    status_map = {}
    for line in log.split("\n"):
        parts = line.split()
        if len(parts) < 2:
            continue
        if line.startswith("FAILED"):
            status_map[parts[1]] = "FAILED"
        elif " PASSED " in line:
            if parts[1] == "PASSED":
                status_map[parts[0]] = "PASSED"
        elif line.startswith("PASSED"):
            status_map[parts[1]] = "PASSED"
    return status_map


def parse_log_sympy(log):
    """sympy's ``bin/test --verbose``: ``test_x ok`` / ``F`` / ``E`` lines and failure headers."""
    status_map = {}
    for match in re.findall(r"(_*) (.*)\.py:(.*) (_*)", log):
        status_map["%s.py:%s" % (match[1], match[2])] = "FAILED"
    for line in log.split("\n"):
        line = line.strip()
        if not line.startswith("test_"):
            continue
        for suffix, status in ((" E", "ERROR"), (" F", "FAILED"), (" ok", "PASSED")):
            if line.endswith(suffix):
                status_map[line.split()[0]] = status
    return status_map


_DJANGO_LATE_OK = (
    r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
    r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
    r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$",
)


def _django_line(line, prev, status_map):
    if "--version is equivalent to version" in line:
        status_map["--version is equivalent to version"] = "PASSED"
    for suffix in (" ... ok", " ... OK", " ...  OK"):
        if line.endswith(suffix):
            if line.strip().startswith("Applying sites.0002_alter_domain_unique...test_no_migrations"):
                line = line.split("...", 1)[-1].strip()  # django__django-7188, as upstream
            status_map[line.rsplit(suffix, 1)[0]] = "PASSED"
            break
    if " ... skipped" in line:
        status_map[line.split(" ... skipped")[0]] = "SKIPPED"
    if line.endswith(" ... FAIL"):
        status_map[line.split(" ... FAIL")[0]] = "FAILED"
    if line.startswith("FAIL:"):
        status_map[line.split()[1].strip()] = "FAILED"
    if line.endswith(" ... ERROR"):
        status_map[line.split(" ... ERROR")[0]] = "ERROR"
    if line.startswith("ERROR:"):
        status_map[line.split()[1].strip()] = "ERROR"
    if line.lstrip().startswith("ok") and prev is not None:
        status_map[prev] = "PASSED"  # output printed between "..." and "ok"


def parse_log_django(log):
    """django's ``runtests.py --verbosity 2``: ``name (module.Class) ... ok`` lines."""
    status_map = {}
    prev = None
    for line in log.split("\n"):
        line = line.strip()
        if " ... " in line:
            prev = line.split(" ... ")[0]
        _django_line(line, prev, status_map)
    for pattern in _DJANGO_LATE_OK:
        for match in re.finditer(pattern, log, re.MULTILINE):
            status_map[match.group(1)] = "PASSED"
    return status_map


PARSERS = {
    "parse_log_pytest": parse_log_pytest,
    "parse_log_pytest_options": parse_log_pytest_options,
    "parse_log_pytest_v2": parse_log_pytest_v2,
    "parse_log_django": parse_log_django,
    "parse_log_seaborn": parse_log_seaborn,
    "parse_log_sympy": parse_log_sympy,
    "parse_log_matplotlib": parse_log_matplotlib,
}
"""Parser name (as in ``swebench.harness.log_parsers.PARSER_REGISTRY``) -> function."""
PARSER_BY_REPO = {
    "astropy/astropy": "parse_log_pytest_v2",
    "django/django": "parse_log_django",
    "marshmallow-code/marshmallow": "parse_log_pytest",
    "matplotlib/matplotlib": "parse_log_matplotlib",
    "mwaskom/seaborn": "parse_log_seaborn",
    "pallets/flask": "parse_log_pytest",
    "psf/requests": "parse_log_pytest_options",
    "pvlib/pvlib-python": "parse_log_pytest",
    "pydata/xarray": "parse_log_pytest",
    "pydicom/pydicom": "parse_log_pytest_options",
    "pylint-dev/astroid": "parse_log_pytest",
    "pylint-dev/pylint": "parse_log_pytest_options",
    "pytest-dev/pytest": "parse_log_pytest",
    "pyvista/pyvista": "parse_log_pytest",
    "scikit-learn/scikit-learn": "parse_log_pytest_v2",
    "sqlfluff/sqlfluff": "parse_log_pytest",
    "sphinx-doc/sphinx": "parse_log_pytest_v2",
    "sympy/sympy": "parse_log_sympy",
}
"""``swebench.harness.log_parsers.MAP_REPO_TO_PARSER_PY`` by parser name; other repos: pytest's."""
DEFAULT_PARSER = "parse_log_pytest"


def parser_name(repo, name=None):
    """The parser a row uses: its own ``log_parser``, else its repository's, else pytest's."""
    name = name or PARSER_BY_REPO.get(repo, DEFAULT_PARSER)
    if name not in PARSERS:
        raise ValueError("log_parser: unknown parser %r; expected one of %s" % (name, sorted(PARSERS)))
    return name


def parse_log(repo, log, name=None):
    """Test id -> status, as SWE-bench's parser for ``repo`` records them."""
    return PARSERS[parser_name(repo, name)](log)


def _resolve_case(case, status_map):
    # as upstream: an id truncated inside its parameter matches by prefix when the candidates agree
    if case in status_map:
        return case
    if case.count("[") > case.count("]"):
        matches = [k for k in status_map if k.startswith(case)]
        if matches and len({status_map[k] in ("PASSED", "XFAIL") for k in matches}) == 1:
            return matches[0]
    return None


def grade(status_map, fail_to_pass, pass_to_pass, exit_code=None):
    """The harness's verdict: ``resolved`` and, per required id, passed / ``missing`` / ``failing``.

    FAIL_TO_PASS passes as PASSED or XFAIL; PASS_TO_PASS also as SKIPPED. A required id the log
    does not hold is missing; one with another status (FAILED, ERROR, a skipped FAIL_TO_PASS) fails.
    As the harness cross-checks the log against the test command's exit status: a command that
    exited non-zero while its log reports no FAILED or ERROR test is not a run the log describes
    (e.g. a patch printing its own PASSED lines), so nothing is resolved (``invalid`` says why).
    """
    if exit_code not in (None, 0) and status_map and not any(v in ("FAILED", "ERROR") for v in status_map.values()):
        return {"resolved": False, "passed": [], "missing": [], "failing": list(fail_to_pass) + list(pass_to_pass),
                "invalid": "the test command exited %s while its log reports no failing test" % exit_code}
    passed, missing, failing = [], [], []
    for tests, ok in ((fail_to_pass, ("PASSED", "XFAIL")), (pass_to_pass, ("PASSED", "XFAIL", "SKIPPED"))):
        for case in tests:
            key = _resolve_case(case, status_map)
            if key is None:
                missing.append(case)
            elif status_map[key] in ok:
                passed.append(case)
            else:
                failing.append(case)
    return {"resolved": not missing and not failing, "passed": passed, "missing": missing, "failing": failing}


def verdict_text(verdict):
    """The summary printed after the log: one line per required id, then the verdict with lists."""
    lines = ["=" * 20 + " short test summary info " + "=" * 20]
    lines += ["PASSED %s" % t for t in verdict["passed"]]
    lines += ["FAILED %s" % t for t in verdict["failing"] + verdict["missing"]]
    lines.append("=" * 20 + " SWE-bench verdict: %s " % ("resolved" if verdict["resolved"] else "not resolved") + "=" * 20)
    if verdict.get("invalid"):
        lines.append("invalid run: %s" % verdict["invalid"])
    lines.append("required tests: %d passed, %d failing, %d missing" % (
        len(verdict["passed"]), len(verdict["failing"]), len(verdict["missing"])))
    lines += ["failing: %s" % t for t in verdict["failing"]]
    lines += ["missing: %s" % t for t in verdict["missing"]]
    return "\n".join(lines)


def main(argv):
    """``SPEC LOG [EXIT_CODE]``: SPEC is JSON with ``repo``, ``log_parser``, ``FAIL_TO_PASS``,
    ``PASS_TO_PASS``; EXIT_CODE the test command's exit status."""
    with open(argv[0]) as fh:
        spec = json.load(fh)
    with open(argv[1], "rb") as fh:
        log = fh.read().decode("utf-8", "replace")
    exit_code = int(argv[2]) if len(argv) > 2 and argv[2].lstrip("-").isdigit() else None
    verdict = grade(parse_log(spec["repo"], log, spec.get("log_parser")), spec["FAIL_TO_PASS"], spec["PASS_TO_PASS"],
                    exit_code)
    status = "" if exit_code is None else "test command exit status: %d\n" % exit_code
    sys.stdout.write(log.rstrip("\n") + "\n" + verdict_text(verdict) + "\n" + status)
    return 0 if verdict["resolved"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
