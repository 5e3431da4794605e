"""Filler for generated projects: working Python functions (with real tests), docs, config.

Every filler function is correct and its test passes under real pytest; filler exists to make
files long and realistic so that reading what the task needs costs context.
A filler block is a list of lines plus "slots": indices before which a statement line may be
inserted without breaking the file (inside docstrings for Python, between paragraphs for docs,
inside sections for config).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NOUNS = (
    "order", "invoice", "parcel", "sensor", "reading", "ticket", "session", "account", "shipment",
    "batch", "record", "event", "metric", "report", "item", "route", "job", "device", "payment",
    "customer", "station", "message", "upload", "vendor", "profile", "alert", "token", "entry",
)
VERBS = ("validated", "stored", "archived", "forwarded", "merged", "indexed", "audited", "cached", "replayed")


@dataclass
class Block:
    """Lines of a file fragment and the insertion slots inside it (indices into ``lines``)."""

    lines: list[str]
    slots: list[int] = field(default_factory=list)
    indent: str = ""
    tests: list[tuple[str, str]] = field(default_factory=list)  # (test name, test body)
    names: list[str] = field(default_factory=list)  # importable names defined by the block


def _doc(rng: random.Random, summary: str, extra: int) -> tuple[list[str], list[int]]:
    """A function docstring (4-space indented); slots sit after the summary line."""
    if extra == 0 and rng.random() < 0.5:
        return [f'    """{summary}"""'], []
    body = [f'    """{summary}', ""]
    for _ in range(extra):
        body.append("    " + rng.choice(DOC_SENTENCES).replace("{n}", rng.choice(NOUNS)).replace("{v}", rng.choice(VERBS)))
    body.append('    """')
    return body, [2]


def _func(rng: random.Random, used: set[str], kind: int) -> Block:
    n = rng.choice(NOUNS)
    a, b = rng.randint(0, 10), rng.randint(50, 500)
    k = rng.randint(3, 12)
    s = rng.choice(VERBS)
    templates = [
        (f"clamp_{n}", f"Clamp a {n} reading into the closed range [low, high].",
         [f"def clamp_{n}(value, low={a}, high={b}):", "DOC", "    if value < low:", "        return low",
          "    if value > high:", "        return high", "    return value"],
         [f"    assert clamp_{n}({b + 7}) == {b}", f"    assert clamp_{n}({a - 1}) == {a}", f"    assert clamp_{n}({a + 1}) == {a + 1}"]),
        (f"{n}_slug", f"Lower-case ``text`` and join its words with dashes for {n} URLs.",
         [f"def {n}_slug(text):", "DOC", "    words = [w for w in text.lower().split() if w]", '    return "-".join(words)'],
         [f'    assert {n}_slug("  Hello  World ") == "hello-world"', f'    assert {n}_slug("") == ""']),
        (f"count_{s}_{n}s", f"Number of {n} records whose status is ``status``.",
         [f'def count_{s}_{n}s(records, status="{s}"):', "DOC",
          '    return sum(1 for r in records if r.get("status") == status)'],
         [f'    assert count_{s}_{n}s([{{"status": "{s}"}}, {{"status": "new"}}, {{}}]) == 1']),
        (f"mean_{n}", f"Arithmetic mean of the {n} values; 0.0 for an empty list.",
         [f"def mean_{n}(values):", "DOC", "    if not values:", "        return 0.0", "    return sum(values) / len(values)"],
         [f"    assert mean_{n}([1, 2, 3, 6]) == 3.0", f"    assert mean_{n}([]) == 0.0"]),
        (f"unique_{n}s", "Items without duplicates, in first-seen order.",
         [f"def unique_{n}s(items):", "DOC", "    seen = set()", "    result = []", "    for item in items:",
          "        if item not in seen:", "            seen.add(item)", "            result.append(item)", "    return result"],
         [f"    assert unique_{n}s([3, 1, 3, 2, 1]) == [3, 1, 2]"]),
        (f"parse_{n}_pairs", f"Parse comma-separated ``key=value`` pairs into a dict of {n} settings.",
         [f"def parse_{n}_pairs(text):", "DOC", "    pairs = {}", '    for part in text.split(","):', '        if "=" in part:',
          '            key, value = part.split("=", 1)', "            pairs[key.strip()] = value.strip()", "    return pairs"],
         [f'    assert parse_{n}_pairs("a=1, b = two,junk") == {{"a": "1", "b": "two"}}']),
        (f"{n}_growth", "Relative change from ``old`` to ``new`` in percent, rounded to one decimal.",
         [f"def {n}_growth(old, new):", "DOC", "    if old == 0:", "        return 0.0", "    return round((new - old) / old * 100, 1)"],
         [f"    assert {n}_growth(50, 60) == 20.0", f"    assert {n}_growth(0, 5) == 0.0"]),
        (f"is_valid_{n}_code", f"Whether ``code`` is a well-formed {n} code ({k} letters or digits).",
         [f"def is_valid_{n}_code(code):", "DOC", f"    return len(code) == {k} and code.isalnum()"],
         [f'    assert is_valid_{n}_code("{"a1" * (k // 2)}{"z" * (k % 2)}")', f'    assert not is_valid_{n}_code("{"-" * k}")']),
        (f"last_{n}s", f"The last ``size`` {n} values (all of them when there are fewer).",
         [f"def last_{n}s(values, size={k}):", "DOC", "    if size <= 0:", "        return []", "    return values[-size:]"],
         [f"    assert last_{n}s(list(range(20)), 3) == [17, 18, 19]", f"    assert last_{n}s([1], 0) == []"]),
        (f"{n.capitalize()}Registry", f"In-memory registry of {n} entries keyed by name.",
         [f"class {n.capitalize()}Registry:", "DOC", "", "    def __init__(self):", "        self._items = {}", "",
          "    def add(self, name, value):", '        """Register ``value`` under ``name``; return the previous value."""',
          "        previous = self._items.get(name)", "        self._items[name] = value", "        return previous", "",
          "    def names(self):", '        """Registered names in sorted order."""', "        return sorted(self._items)"],
         [f"    registry = {n.capitalize()}Registry()", '    assert registry.add("b", 1) is None', '    assert registry.add("a", 2) is None',
          '    assert registry.add("b", 3) == 1', '    assert registry.names() == ["a", "b"]']),
    ]
    name, summary, code, test = templates[kind % len(templates)]
    if name in used:
        return Block([])
    used.add(name)
    doc, doc_slots = _doc(rng, summary, rng.choice((0, 1, 2, 3)))
    at = code.index("DOC")
    lines = code[:at] + doc + code[at + 1 :]
    return Block(lines, [at + s for s in doc_slots], "    ", [(f"test_{name.lower()}", "\n".join(test) + "\n")], [name])


DOC_SENTENCES = (
    "Each {n} is {v} once and never modified afterwards.",
    "The {n} pipeline keeps its state in memory and writes snapshots periodically.",
    "A {n} that fails validation is {v} in the quarantine area for inspection.",
    "Operators can inspect every {n} from the admin console.",
    "The {n} queue is drained in arrival order; retries go to the back of the queue.",
    "Nothing here talks to the network; callers pass in every value explicitly.",
    "Every {n} carries a monotonic revision number that increases on each change.",
    "Timestamps are UTC and stored as integers.",
    "Large {n} exports are streamed instead of being built in memory.",
    "This behaviour is relied upon by the nightly {n} reconciliation job.",
    "See the operations guide for the on-call procedure when a {n} gets stuck.",
    "Metrics for each {n} are {v} by the collector every minute.",
    "The function is pure and safe to call from several threads.",
    "Input is assumed to be {v} already; no further checks are made.",
    "Empty input is allowed and gives an empty result.",
    "Names are compared case-sensitively.",
)

HEADINGS = (
    "Overview", "Design", "Operations", "Troubleshooting", "Data model", "Lifecycle", "Monitoring",
    "Upgrading", "Security", "Performance", "Limits", "Glossary", "History", "Integration",
)


def doc_paragraph(rng: random.Random) -> list[str]:
    return [
        rng.choice(DOC_SENTENCES).replace("{n}", rng.choice(NOUNS)).replace("{v}", rng.choice(VERBS))
        for _ in range(rng.randint(2, 4))
    ]


def doc_block(rng: random.Random) -> Block:
    """A markdown section; slots are the blank lines between paragraphs."""
    lines = [f"## {rng.choice(HEADINGS)}", ""]
    slots = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            lines += [f"- {rng.choice(NOUNS)}: " + doc_paragraph(rng)[0] for _ in range(rng.randint(2, 4))]
        else:
            lines += doc_paragraph(rng)
        slots.append(len(lines))
        lines.append("")
    return Block(lines, slots)


CONFIG_ATTRS = ("enabled", "workers", "label", "poll_interval_s", "queue_depth", "log_level", "owner", "region")


def config_value(rng: random.Random, attr: str) -> str:
    if attr == "enabled":
        return rng.choice(("true", "false"))
    if attr in ("workers", "queue_depth", "poll_interval_s"):
        return str(rng.randint(1, 64))
    if attr == "log_level":
        return rng.choice(('"info"', '"debug"', '"warning"'))
    if attr == "region":
        return rng.choice(('"eu-west"', '"us-east"', '"ap-south"'))
    return f'"{rng.choice(NOUNS)}-{rng.choice(VERBS)}"'


def config_block(rng: random.Random, section: str, used: set[str]) -> Block:
    """A TOML section; slots follow each key line (so inserted keys stay in the section)."""
    lines = [f"[{section}]"]
    slots = [1]
    for attr in rng.sample(CONFIG_ATTRS, rng.randint(2, 5)):
        key = f"{rng.choice(NOUNS)}_{attr}"
        if key in used:
            continue
        used.add(key)
        if rng.random() < 0.3:
            lines.append(f"# {rng.choice(DOC_SENTENCES).replace('{n}', rng.choice(NOUNS)).replace('{v}', rng.choice(VERBS))}")
        lines.append(f"{key} = {config_value(rng, attr)}")
        slots.append(len(lines))
    lines.append("")
    return Block(lines, slots)
