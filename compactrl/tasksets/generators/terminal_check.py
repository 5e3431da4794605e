"""The final-state checker of generated terminal tasks. Standard library only, no compactrl imports.

One function, :func:`check_state`, decides success from file contents alone. The sim backend calls
it in-process on its in-memory files (it only reads them as data); the real backends run the very
same source, embedded by :func:`render_script` into a hidden ``.compactrl_check.py`` that reads
the work dir and exits 0 on success. A spec is a JSON object ``{"checks": [...]}``; each check:

* ``{"type": "text", "path", "expected"}``: the file's lines, trailing blanks and blank lines at
  the end ignored, equal the expected text's.
* ``{"type": "kv", "path", "sep", "expected": {key: value}, "original"}``: each key is set exactly
  once (``key SEP value``, any spacing around ``SEP``) to its value, and every other line equals
  the original file's (in order): the repair changed only what it had to.
* ``{"type": "csv_totals", "path", "header", "expected": {label: number}, "tolerance"}``: a header
  line, then one ``label,number`` row per expected label in sorted label order, each number within
  ``tolerance``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

Reader = Callable[[str], "str | None"]


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def _check_text(spec: dict, text: str) -> list[str]:
    if _lines(text) != _lines(spec["expected"]):
        got = "\\n".join(_lines(text))[:200]
        return [f"{spec['path']}: content {got!r} is not what was asked"]
    return []


def _check_kv(spec: dict, text: str) -> list[str]:
    sep = re.escape(spec["sep"])
    keys = spec["expected"]
    found: dict[str, list[str]] = {k: [] for k in keys}
    rest: list[str] = []
    for line in _lines(text):
        m = re.match(rf"^\s*([^\s#;]+?)\s*{sep}\s*(.*?)\s*$", line)
        if m and m.group(1) in keys:
            found[m.group(1)].append(m.group(2))
        else:
            rest.append(line)
    errors = []
    for key, value in keys.items():
        if found[key] != [value]:
            shown = found[key] if found[key] else "missing"
            errors.append(f"{spec['path']}: {key} is {shown}, not the required value")
    original_rest = [line for line in _lines(spec["original"])
                     if not ((m := re.match(rf"^\s*([^\s#;]+?)\s*{sep}", line)) and m.group(1) in keys)]
    if rest != original_rest:
        errors.append(f"{spec['path']}: lines other than the repaired settings were changed")
    return errors


def _check_csv_totals(spec: dict, text: str) -> list[str]:
    lines = [line for line in _lines(text) if line.strip()]
    path = spec["path"]
    if not lines or lines[0].strip() != spec["header"]:
        return [f"{path}: the first line must be the header {spec['header']!r}"]
    expected = spec["expected"]
    rows = lines[1:]
    labels = [r.split(",", 1)[0].strip() for r in rows]
    if labels != sorted(expected):
        return [f"{path}: rows must be exactly {sorted(expected)} in that order, got {labels[:20]}"]
    errors = []
    for row in rows:
        label, _, value = row.partition(",")
        try:
            number = float(value)
        except ValueError:
            errors.append(f"{path}: {label.strip()}: {value.strip()!r} is not a number")
            continue
        if abs(number - float(expected[label.strip()])) > float(spec.get("tolerance", 0.0)):
            errors.append(f"{path}: {label.strip()}: {number} is wrong")
    return errors


_CHECKS = {"text": _check_text, "kv": _check_kv, "csv_totals": _check_csv_totals}


def check_state(spec: dict, read: Reader) -> list[str]:
    """Every way the final state fails ``spec`` (empty list: success). ``read(path)`` returns a
    work-dir file's text, or None when it is missing or not a file."""
    errors: list[str] = []
    for item in spec["checks"]:
        text = read(item["path"])
        if text is None:
            errors.append(f"{item['path']}: missing")
            continue
        errors.extend(_CHECKS[item["type"]](item, text))
    return errors


_MAIN = '''

def _read(path):
    import os
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


if __name__ == "__main__":
    import sys
    _errors = check_state(json.loads(SPEC), _read)
    for _e in _errors:
        print("FAIL", _e)
    print("PASSED check" if not _errors else "FAILED check")
    sys.exit(1 if _errors else 0)
'''


def render_script(spec: dict) -> str:
    """A standalone Python 3 script that checks ``spec`` against the current directory."""
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    body = source.split('_MAIN = ', 1)[0]
    return body + f"\nSPEC = {json.dumps(json.dumps(spec, sort_keys=True))}\n" + _MAIN
