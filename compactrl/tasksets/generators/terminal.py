"""Seeded generator of terminal tasks: find facts scattered over large files, then act on them.

Every task hides ``num_facts`` facts ("needle" lines) deep inside log, note and data files, among
filler and look-alike *distractors* (proposed, rejected, partial or outdated values), and asks for
a final state that needs all of them. Three families:

* ``config_repair``: settings in ``app/<service>.conf`` hold wrong values; the approved values are
  in change records under ``notes/`` and ``logs/``. Fix exactly those lines in place.
* ``log_report``: sum the final daily request counts of some nodes (``logs/<node>/<day>.log``;
  partial summaries do not count) into ``report.txt``.
* ``data_transform``: build ``out/revenue.csv`` from ``data/orders.csv`` with the exchange rate and
  the order status that the finance notes approve.

A reader that looks at the files (``cat``/``sed -n``) overflows a small context before it has every
fact; a clever ``grep`` can shorten the search, as in real work. Success is decided from the final
files alone by :mod:`compactrl.tasksets.generators.terminal_check` (in-process on the sim backend, as a
hidden ``python3 .compactrl_check.py`` on the real ones).

``TerminalTaskGenerator(config).generate(seed)`` is a pure function of ``(config, seed)``; splits
are the disjoint seed sets that every generator shares
(:func:`~compactrl.tasksets.generators._seeded.task_seed_for`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from compactrl.sandbox.base import TestReport
from compactrl.task import Check, Task
from compactrl.tasksets.generators._seeded import (
    GeneratedTasks,
    SeededGenerator,
    config_record,
    resolve_preset,
)
from compactrl.tasksets.generators.terminal_check import check_state, render_script

FAMILIES = ("config_repair", "log_report", "data_transform")
CHECK_SCRIPT = ".compactrl_check.py"
CHECK_COMMAND = f"python3 {CHECK_SCRIPT}"

SERVICES = ("billing", "gateway", "search", "ledger", "notifier", "scheduler", "uploads", "reports")
COMPONENTS = ("api", "worker", "db", "cache", "auth", "queue", "cron", "proxy")
USERS = ("alice", "bob", "chen", "dana", "emeka", "farah", "gus", "hana", "ivan", "june")
REGIONS = ("central", "east", "north", "south", "west")
STATUSES = ("shipped", "pending", "refunded", "cancelled")
SETTINGS = (
    ("db.pool_size", (8, 128)), ("cache.ttl_seconds", (60, 3600)), ("http.timeout_ms", (200, 9000)),
    ("worker.concurrency", (2, 64)), ("queue.max_retries", (1, 12)), ("backup.retention_days", (3, 90)),
    ("rate_limit.per_minute", (100, 5000)), ("session.idle_minutes", (5, 240)), ("upload.max_mb", (5, 500)),
    ("metrics.flush_seconds", (5, 300)), ("search.max_results", (10, 1000)), ("mail.batch_size", (10, 400)),
)


@dataclass(frozen=True)
class TerminalTaskConfig:
    """Knobs of the generator (validated on construction)."""

    name: str = "custom"
    """Label used in task ids (presets use their own name)."""
    families: tuple[str, ...] = FAMILIES
    """Task families to draw from (uniformly)."""
    num_facts: int = 2
    """Facts the final state needs (``data_transform`` uses 2: the rate and the status)."""
    file_lines: tuple[int, int] = (30, 60)
    """Inclusive range of lines per file that holds a fact (logs, notes, configs)."""
    fact_depth: tuple[float, float] = (0.4, 0.9)
    """Where a fact sits in its file, as a fraction of its length (0 top, 1 bottom)."""
    distractors_per_fact: int = 2
    """Look-alike lines with wrong values per fact (proposals, rejections, partial counts)."""
    extra_files: int = 3
    """Unrelated files (other nodes, days, services) next to the ones that matter."""
    max_turns: int = 40
    """Turn limit stored in each task."""
    flaky_test_p: float = 0.0
    """Probability that a checker run (a submit, the grading at a limit) also fails, whatever the
    state; a submit whose run flaked is not accepted and the episode goes on (as the code tasks'
    knob: :mod:`compactrl.tasksets.generators.dynamics`)."""

    def __post_init__(self) -> None:
        _check(bool(self.families) and set(self.families) <= set(FAMILIES), "families",
               f"a non-empty subset of {FAMILIES}", self.families)
        _check(1 <= self.num_facts <= 6, "num_facts", "in [1, 6]", self.num_facts)
        lo, hi = self.file_lines
        _check(4 <= lo <= hi, "file_lines", "(lo, hi) with 4 <= lo <= hi", self.file_lines)
        dlo, dhi = self.fact_depth
        _check(0.0 <= dlo <= dhi <= 1.0, "fact_depth", "(lo, hi) with 0 <= lo <= hi <= 1", self.fact_depth)
        _check(0 <= self.distractors_per_fact <= 8, "distractors_per_fact", "in [0, 8]", self.distractors_per_fact)
        _check(0 <= self.extra_files <= 20, "extra_files", "in [0, 20]", self.extra_files)
        _check(self.max_turns >= 1, "max_turns", ">= 1", self.max_turns)
        _check(0.0 <= self.flaky_test_p < 1.0, "flaky_test_p", "a value in [0, 1)", self.flaky_test_p)

    def record(self) -> dict:
        """The fields as JSON-ready values, ``flaky_test_p`` only when set (see :func:`config_record`)."""
        return config_record(self, ("flaky_test_p",))


def _check(ok: bool, name: str, expected: str, got: object) -> None:
    if not ok:
        raise ValueError(f"TerminalTaskConfig.{name}: expected {expected}, got {got!r}")


PRESETS: dict[str, TerminalTaskConfig] = {
    "easy": TerminalTaskConfig(name="easy", num_facts=1, file_lines=(8, 16), fact_depth=(0.0, 1.0),
                               distractors_per_fact=1, extra_files=1, max_turns=16),
    "default": TerminalTaskConfig(name="default"),
    "hard": TerminalTaskConfig(name="hard", num_facts=4, file_lines=(120, 240), fact_depth=(0.6, 0.95),
                               distractors_per_fact=4, extra_files=8, max_turns=100),
}


def preset(difficulty: str | TerminalTaskConfig) -> TerminalTaskConfig:
    """The config of a preset name (``easy``, ``default``, ``hard``), or ``difficulty`` itself."""
    return resolve_preset(difficulty, PRESETS, TerminalTaskConfig)


class TerminalTaskGenerator(SeededGenerator[TerminalTaskConfig]):
    """``generate(seed) -> Task``, pure and reproducible (a small LRU cache of recent tasks)."""

    def __init__(self, config: TerminalTaskConfig | str = "default") -> None:
        super().__init__(preset(config), PRESETS, _generate, cache_size=256)


GeneratedTerminalTasks = GeneratedTasks  # the name the terminal env and its tests use


# ===================================================================== building blocks
@dataclass
class _Doc:
    """A file under construction: filler lines, with needles inserted at chosen depths."""

    path: str
    lines: list[str]
    inserts: list[tuple[float, str, str | None]] = field(default_factory=list)  # (depth, line, fact key)

    def render(self) -> tuple[str, dict[str, int]]:
        lines = list(self.lines)
        where: dict[str, int] = {}
        for depth, line, key in sorted(self.inserts, key=lambda x: x[0]):
            at = min(len(lines), int(round(depth * len(lines))))
            lines.insert(at, line)
            for k, v in list(where.items()):
                if v >= at + 1:
                    where[k] = v + 1
            if key is not None:
                where[key] = at + 1
        return "\n".join(lines) + "\n", where


def _stamp(rng: random.Random, day: int | None = None) -> str:
    d = day if day is not None else rng.randint(1, 28)
    return f"2024-03-{d:02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"


def _log_filler(rng: random.Random, n: int, day: int | None = None) -> list[str]:
    out = []
    for _ in range(n):
        comp = rng.choice(COMPONENTS)
        kind = rng.random()
        if kind < 0.55:
            out.append(f"{_stamp(rng, day)} INFO {comp}: request id={rng.getrandbits(24):06x} user={rng.choice(USERS)} "
                       f"status={rng.choice([200, 200, 200, 201, 204, 304, 404, 500])} ms={rng.randint(2, 900)}")
        elif kind < 0.8:
            out.append(f"{_stamp(rng, day)} WARN {comp}: queue depth {rng.randint(10, 400)} above soft limit "
                       f"{rng.choice([50, 100, 200])}")
        elif kind < 0.9:
            out.append(f"{_stamp(rng, day)} ERROR {comp}: upstream timeout after {rng.randint(1, 30)}s "
                       f"(attempt {rng.randint(1, 5)})")
        else:
            out.append(f"{_stamp(rng, day)} DEBUG {comp}: cache hit ratio {rng.randint(40, 99)}%")
    return out


_NOTE_SENTENCES = (
    "The on-call rotation moves to the new schedule next week.",
    "Dashboards were reorganised by service; old links redirect.",
    "Remember to tag releases before deploying to production.",
    "The staging database is refreshed from a snapshot every Sunday.",
    "Alert thresholds are reviewed at the end of every quarter.",
    "Runbooks live next to the code; keep them short and current.",
    "A postmortem is written for every incident that pages someone.",
    "Capacity planning uses the last 90 days of traffic.",
    "Retired hosts are removed from the inventory within a day.",
    "Secrets rotate automatically; never paste them into tickets.",
)


def _note_filler(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(f"## {rng.choice(['Week', 'Sprint', 'Review'])} {rng.randint(1, 52)}")
        elif r < 0.25:
            out.append("")
        elif r < 0.5:
            out.append(f"- {rng.choice(USERS)}: {rng.choice(_NOTE_SENTENCES)}")
        else:
            out.append(rng.choice(_NOTE_SENTENCES))
    return out


def _lines_for(rng: random.Random, cfg: TerminalTaskConfig) -> int:
    return rng.randint(*cfg.file_lines)


def _depth(rng: random.Random, cfg: TerminalTaskConfig) -> float:
    return rng.uniform(*cfg.fact_depth)


# ===================================================================== families
@dataclass
class _Plan:
    """What a family produces: files, facts (with their file/line), the instruction, the solution
    commands (``{key}`` placeholders) and the check spec."""

    docs: list[_Doc]
    plain: dict[str, str]
    facts: list[dict]
    instruction: str
    solution: list[str]
    spec: dict


def _config_repair(rng: random.Random, cfg: TerminalTaskConfig) -> _Plan:
    service = rng.choice(SERVICES)
    chosen = rng.sample(SETTINGS, cfg.num_facts)
    names = ["notes/ops-journal.md", "notes/changelog.md", "logs/deploy.log", "notes/incidents.md",
             "logs/audit.log", "notes/handover.md"]
    hosts = [_Doc(p, (_log_filler if p.endswith(".log") else _note_filler)(rng, _lines_for(rng, cfg)))
             for p in names[: max(3, cfg.num_facts)]]
    homes = rng.sample(hosts, cfg.num_facts)  # one fact per file: each must be read on its own
    conf_lines, facts = _config_body(rng, cfg, service, [k for k, _ in chosen]), []
    values: dict[str, str] = {}
    for (key, (lo, hi)), host in zip(chosen, homes):
        right = rng.randint(lo, hi)
        wrongs = _distinct_numbers(rng, lo, hi, right, cfg.distractors_per_fact + 1)
        values[key] = str(right)
        chg = rng.randint(1000, 9999)
        needle = f"{_stamp(rng)} APPROVED change CHG-{chg}: set {key} = {right} on {service} (owner: {rng.choice(USERS)})"
        host.inserts.append((_depth(rng, cfg), needle, key))
        for k, w in enumerate(wrongs[1:]):
            verdict = ("PROPOSED", "REJECTED", "REVERTED")[k % 3]
            where = rng.choice(hosts)
            where.inserts.append((rng.random(), f"{_stamp(rng)} {verdict} change CHG-{rng.randint(1000, 9999)}: "
                                                f"set {key} = {w} on {service} (owner: {rng.choice(USERS)})", None))
        conf_lines = [f"{key} = {wrongs[0]}" if line == f"{key} = ?" else line for line in conf_lines]
        facts.append({"key": key, "value": str(right), "file": host.path,
                      "pattern": rf"APPROVED change CHG-\d+: set {re.escape(key)} = (\S+) on {service} ",
                      "wrong": [str(w) for w in wrongs]})
    conf_path = f"app/{service}.conf"
    original = "\n".join(conf_lines) + "\n"
    keys = ", ".join(k for k, _ in chosen)
    instruction = (
        f"The settings {keys} in {conf_path} have wrong values. Every change to the service is recorded "
        f"in the notes/ and logs/ files as PROPOSED, REJECTED, REVERTED or APPROVED; the APPROVED change "
        f"gives the right value. Fix those settings in {conf_path} in place (keep the `key = value` form) "
        f"and change nothing else. Submit when done."
    )
    solution = [f"sed -i 's/^{re.escape(k)} = .*/{k} = {{f{i}}}/' {conf_path}" for i, (k, _) in enumerate(chosen)]
    spec = {"checks": [{"type": "kv", "path": conf_path, "sep": "=", "expected": values, "original": original}]}
    return _Plan(hosts, {conf_path: original}, facts, instruction, solution, spec)


def _config_body(rng: random.Random, cfg: TerminalTaskConfig, service: str, keys: list[str]) -> list[str]:
    others = [k for k, _ in SETTINGS if k not in keys]
    lines = [f"# {service} service configuration", "# values are reloaded on restart", ""]
    body = [f"{k} = {rng.randint(lo, hi)}" for k, (lo, hi) in SETTINGS if k in others]
    body = rng.sample(body, min(len(body), max(3, _lines_for(rng, cfg) // 6))) + [f"{k} = ?" for k in keys]
    rng.shuffle(body)
    for line in body:
        if rng.random() < 0.3:
            lines.append(f"# {rng.choice(_NOTE_SENTENCES)}")
        lines.append(line)
    return lines


def _distinct_numbers(rng: random.Random, lo: int, hi: int, avoid: int, n: int) -> list[int]:
    pool = [v for v in range(lo, hi + 1) if v != avoid]
    return rng.sample(pool, min(n, len(pool)))


def _log_report(rng: random.Random, cfg: TerminalTaskConfig) -> _Plan:
    nodes = [f"web-{i}" for i in range(1, 9)]
    wanted = sorted(rng.sample(nodes, cfg.num_facts))
    day = rng.randint(2, 27)
    others = [(n, d) for n in nodes for d in (day - 1, day, day + 1) if (n, d) not in {(w, day) for w in wanted}]
    extra = rng.sample(others, min(len(others), cfg.extra_files))
    docs, facts, total = [], [], 0
    for node, d in [(w, day) for w in wanted] + extra:
        doc = _Doc(f"logs/{node}/2024-03-{d:02d}.log", _log_filler(rng, _lines_for(rng, cfg), d))
        served = rng.randint(1000, 9999)
        key = f"{node}@2024-03-{d:02d}"
        needle = f"2024-03-{d:02d} 23:59:59 INFO summary: node={node} day=2024-03-{d:02d} served={served} final=yes"
        is_fact = node in wanted and d == day
        doc.inserts.append((_depth(rng, cfg) if is_fact else rng.uniform(0.5, 1.0), needle, key if is_fact else None))
        for _ in range(cfg.distractors_per_fact):
            partial = rng.randint(100, served - 1)
            doc.inserts.append((rng.random() * 0.9, f"{_stamp(rng, d)} INFO summary: node={node} "
                                                    f"day=2024-03-{d:02d} served={partial} final=no", None))
        if is_fact:
            total += served
            facts.append({"key": key, "value": str(served), "file": doc.path,
                          "pattern": rf"summary: node={node} day=2024-03-{d:02d} served=(\d+) final=yes",
                          "wrong": []})
        docs.append(doc)
    names = " and ".join(wanted) if len(wanted) <= 2 else ", ".join(wanted[:-1]) + " and " + wanted[-1]
    instruction = (
        f"Each web node writes one log per day under logs/<node>/<day>.log. A node's requests for a day are "
        f"given by the summary line with final=yes in that day's log (summaries with final=no are partial "
        f"and do not count). Write the total number of requests served on 2024-03-{day:02d} by {names} to "
        f"report.txt as a single line `served=<total>`. Submit when done."
    )
    solution = ["echo served={total} > report.txt"]
    spec = {"checks": [{"type": "text", "path": "report.txt", "expected": f"served={total}\n"}]}
    return _Plan(docs, {}, facts, instruction, solution, spec)


def _data_transform(rng: random.Random, cfg: TerminalTaskConfig) -> _Plan:
    rate = round(rng.uniform(0.80, 0.99), 4)
    status = rng.choice(STATUSES[:2])
    quarter = f"Q{rng.randint(1, 4)}"
    rows = ["order_id,region,amount_cents,status"]
    totals: dict[str, int] = {}
    for i in range(rng.randint(*cfg.file_lines)):
        region, cents, st = rng.choice(REGIONS), rng.randint(500, 250000), rng.choice(STATUSES)
        rows.append(f"A{10000 + i},{region},{cents},{st}")
        if st == status:
            totals[region] = totals.get(region, 0) + cents
    rates = _Doc("notes/finance.md", _note_filler(rng, _lines_for(rng, cfg)))
    rules = _Doc("notes/revenue-policy.md", _note_filler(rng, _lines_for(rng, cfg)))
    rates.inserts.append((_depth(rng, cfg), f"APPROVED: the {quarter} reporting rate is {rate} EUR per USD.", "rate"))
    rules.inserts.append((_depth(rng, cfg), f"APPROVED: revenue counts orders with status {status} only.", "status"))
    wrong_rates = [round(rate + rng.choice([-1, 1]) * rng.uniform(0.01, 0.05), 4) for _ in range(cfg.distractors_per_fact)]
    for w in wrong_rates:
        rates.inserts.append((rng.random(), f"PROPOSED: the {quarter} reporting rate is {w} EUR per USD "
                                            f"(not approved).", None))
    for w in rng.sample([s for s in STATUSES if s != status], min(cfg.distractors_per_fact, 3)):
        rules.inserts.append((rng.random(), f"OUTDATED: revenue counts orders with status {w} only.", None))
    facts = [
        {"key": "rate", "value": str(rate), "file": rates.path,
         "pattern": rf"APPROVED: the {quarter} reporting rate is ([0-9.]+) EUR per USD", "wrong": [str(w) for w in wrong_rates]},
        {"key": "status", "value": status, "file": rules.path,
         "pattern": r"APPROVED: revenue counts orders with status (\w+) only", "wrong": [s for s in STATUSES if s != status]},
    ]
    expected = {r: round(c / 100 * rate, 2) for r, c in totals.items()}
    instruction = (
        f"data/orders.csv lists orders (amount_cents in USD cents). Create out/revenue.csv with the header "
        f"`region,eur` and one row per region with counted orders, sorted by region: the sum of the counted "
        f"orders' amounts in EUR with 2 decimals. The notes state the APPROVED {quarter} reporting rate and "
        f"which order status counts as revenue (ignore PROPOSED and OUTDATED lines). Submit when done."
    )
    awk = ("awk -F, -v rate={f0} 'NR>1 && $4==\"{f1}\" {{t[$2]+=$3}} "
           "END {{for (r in t) printf \"%s,%.2f\\n\", r, t[r]/100*rate}}' data/orders.csv | sort >> out/revenue.csv")
    solution = ["mkdir -p out", "echo region,eur > out/revenue.csv", awk]
    spec = {"checks": [{"type": "csv_totals", "path": "out/revenue.csv", "header": "region,eur",
                        "expected": expected, "tolerance": 0.011}]}
    return _Plan([rates, rules], {"data/orders.csv": "\n".join(rows) + "\n"}, facts, instruction, solution, spec)


_FAMILY_FNS = {"config_repair": _config_repair, "log_report": _log_report, "data_transform": _data_transform}


def _extra_files(rng: random.Random, cfg: TerminalTaskConfig, taken: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    candidates = [f"logs/{c}.log" for c in COMPONENTS] + [f"notes/{t}.md" for t in ("runbook", "oncall", "faq")]
    for path in rng.sample(candidates, min(cfg.extra_files, len(candidates))):
        if path in taken:
            continue
        n = _lines_for(rng, cfg)
        lines = _log_filler(rng, n) if path.endswith(".log") else _note_filler(rng, n)
        out[path] = "\n".join(lines) + "\n"
    return out


def _generate(cfg: TerminalTaskConfig, label: str, seed: int) -> Task:
    rng = random.Random(f"compactrl-terminal:{seed}")
    family = rng.choice(cfg.families)
    plan = _FAMILY_FNS[family](rng, cfg)
    files = dict(plan.plain)
    where: dict[str, int] = {}
    for doc in plan.docs:
        text, found = doc.render()
        files[doc.path] = text
        where.update(found)
    files.update(_extra_files(rng, cfg, set(files)))
    facts = [dict(f, line=where[f["key"]]) for f in plan.facts]
    task_id = f"terminal-{label}-{seed}"
    return Task(
        id=task_id,
        kind="terminal",
        instruction=plan.instruction,
        files=files,
        check=Check(kind="script", command=CHECK_COMMAND, hidden_files={CHECK_SCRIPT: render_script(plan.spec)},
                    timeout_s=60.0),
        max_turns=cfg.max_turns,
        source="generated",
        metadata={"terminal": {"family": family, "facts": facts, "solution": plan.solution, "spec": plan.spec},
                  **({"dynamics": {"flaky_test_p": cfg.flaky_test_p, "flaky_test": f"{CHECK_SCRIPT}::flaky_clock_check"}}
                     if cfg.flaky_test_p else {})},
    )


# ===================================================================== verdict and solution
def judge_terminal_task(task: Task, files: dict[str, str]) -> TestReport:
    """The sim backend's verdict for a generated terminal task: the checker on the files, in-process."""
    meta = task.metadata.get("terminal")
    if meta is None:
        raise ValueError(f"task {task.id!r}: not a generated terminal task (no metadata['terminal'])")
    errors = check_state(meta["spec"], files.get)
    output = "\n".join([f"FAIL {e}" for e in errors] + ["PASSED check" if not errors else "FAILED check"])
    return TestReport(passed=() if errors else ("check",), failed=("check",) if errors else (), output=output,
                      success=not errors)


def render_solution(task: Task, values: dict[str, str]) -> list[str]:
    """The solution's shell commands with fact ``values`` (by fact key) filled in.

    Templates name the facts ``{f0}``, ``{f1}``... in ``metadata["terminal"]["facts"]`` order, and
    ``{total}`` is their sum (for counts).
    """
    meta = task.metadata["terminal"]
    fill = {f"f{i}": values[f["key"]] for i, f in enumerate(meta["facts"])}
    try:
        fill["total"] = str(sum(int(values[f["key"]]) for f in meta["facts"]))
    except ValueError:
        fill["total"] = "0"
    return [cmd.format(**fill) for cmd in meta["solution"]]
