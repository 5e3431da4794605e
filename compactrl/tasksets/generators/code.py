"""Seeded generator of code-repository tasks whose fix needs facts stated far from the bug.

A task is a small Python project: a package of modules, a README and docs pages, a config file,
visible tests, and hidden specification tests. Some module-level constants of one module (the
*bug file*) hold stale values; the correct values are stated elsewhere (a key in
``config/defaults.toml``, a sentence in the docs, a contract line in another module's docstring),
next to distractors that look alike (outdated values, neighbouring settings). The hidden spec tests
check the functions that use those constants, so the fix needs every fact.

``CodeTaskGenerator(config).generate(seed)`` is a pure function of ``(config, seed)``. Splits are
disjoint seed sets: :func:`task_seed_for` maps ``(split, index)`` to ``index * 3 + k`` with
``k = 0, 1, 2`` for ``train, val, test``, so no test task ever appears in training.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace

from compactrl.task import Check, Task
from compactrl.tasksets.generators._filler import Block, _func, config_block, doc_block, doc_paragraph
from compactrl.tasksets.generators._seeded import SPLITS as SPLITS
from compactrl.tasksets.generators._seeded import GeneratedTasks as GeneratedTasks
from compactrl.tasksets.generators._seeded import (
    SeededGenerator,
    config_record,
    resolve_preset,
    split_of_seed,
)
from compactrl.tasksets.generators._seeded import task_seed_for as task_seed_for
from compactrl.tasksets.generators.facts import CATALOGUE, FactSpec, code_value, render

LOCATIONS = ("config", "doc", "docstring")
PACKAGES = (
    "ledgerline", "parcelhub", "meterkit", "tidewatch", "stockroom", "fleetlog", "billwise", "queuepost",
    "relaybox", "gridnote", "harborops", "tallyman", "beaconlab", "orbitcart", "pinecrest", "quillpay",
)
BUG_MODULES = ("core", "engine", "service", "rules", "pipeline", "runtime")
MODULES = (
    "utils", "models", "storage", "network", "scheduler", "billing", "export", "accounts", "cache",
    "reports", "inventory", "metrics", "events", "formatting", "validation", "registry", "routing", "pricing",
)
DOC_TOPICS = (
    "architecture", "operations", "api", "configuration", "changelog", "deployment", "faq", "glossary",
    "billing", "scheduling", "storage", "security",
)
CONFIG_FILE = "config/defaults.toml"


@dataclass(frozen=True)
class CodeTaskConfig:
    """Knobs of the generator (validated on construction)."""

    name: str = "custom"
    """Label used in task ids (presets use their own name)."""
    num_modules: int = 4
    """Package modules besides the bug file and ``__init__.py`` (>= 1: docstring facts live there)."""
    num_docs: int = 2
    """Markdown pages under ``docs/`` (``README.md`` always exists)."""
    file_lines: tuple[int, int] = (60, 120)
    """Inclusive range of filler lines per module, docs page, README and config file."""
    num_facts: int = 2
    """Stale constants in the bug file, each fixed by one fact stated elsewhere."""
    fact_depth: tuple[float, float] = (0.5, 0.9)
    """Where a fact sits in its file, as a fraction of the file's length (0 top, 1 bottom)."""
    distractors_per_fact: int = 2
    """Look-alike statements with wrong values per fact, anywhere in the project."""
    locations: tuple[str, ...] = LOCATIONS
    """Where facts may be stated: ``config``, ``doc``, ``docstring``."""
    max_turns: int = 30
    """Turn limit stored in each task (the env's default ``max_turns``)."""
    fact_keys: tuple[str, ...] = ()
    """Catalogue keys the facts are drawn from (empty: the whole catalogue)."""
    flaky_test_p: float = 0.0
    """Probability that a test run (the ``test`` tool, a submit, the grading at a limit) also fails
    a flaky test, whatever the work; a submit whose run flaked is not accepted and the episode goes
    on, so the agent must submit again (noise after a summary that no summary can fix)."""
    progress_reward: float = 0.0
    """Reward for each fact's spec test the first time a test run shows it passing, at the step of
    that run (per-trace rewards on top of the outcome's 1.0; 0 = outcome reward only)."""
    demo_order: str = "fixed"
    """How the scripted demonstrators (``ReadingOrderOracle``) order the files where facts may be
    stated: ``fixed`` (config, README, docs, then modules: the same order in every episode) or
    ``shuffled`` (an order drawn per task and demonstrator seed, so how many files an agent reads
    before the fact turns up, and so how many compactions its episode needs, depends on its own
    choices). The project and its runs are the same either way."""

    def __post_init__(self) -> None:
        _check(self.num_modules >= 1, "num_modules", ">= 1", self.num_modules)
        _check(0 <= self.num_docs <= len(DOC_TOPICS), "num_docs", f"in [0, {len(DOC_TOPICS)}]", self.num_docs)
        lo, hi = self.file_lines
        _check(1 <= lo <= hi, "file_lines", "(lo, hi) with 1 <= lo <= hi", self.file_lines)
        _check(1 <= self.num_facts <= len(CATALOGUE), "num_facts", f"in [1, {len(CATALOGUE)}]", self.num_facts)
        dlo, dhi = self.fact_depth
        _check(0.0 <= dlo <= dhi <= 1.0, "fact_depth", "(lo, hi) with 0 <= lo <= hi <= 1", self.fact_depth)
        _check(self.distractors_per_fact >= 0, "distractors_per_fact", ">= 0", self.distractors_per_fact)
        _check(
            bool(self.locations) and set(self.locations) <= set(LOCATIONS),
            "locations", f"a non-empty subset of {LOCATIONS}", self.locations,
        )
        _check(self.max_turns >= 1, "max_turns", ">= 1", self.max_turns)
        _check(self.num_modules <= len(MODULES), "num_modules", f"<= {len(MODULES)}", self.num_modules)
        keys = {spec.key for spec in CATALOGUE}
        _check(set(self.fact_keys) <= keys, "fact_keys", f"keys of the catalogue {sorted(keys)}", self.fact_keys)
        _check(self.num_facts <= len(self.fact_keys or keys), "num_facts", "<= len(fact_keys)", self.num_facts)
        _check(0.0 <= self.flaky_test_p < 1.0, "flaky_test_p", "a value in [0, 1)", self.flaky_test_p)
        _check(self.progress_reward >= 0.0, "progress_reward", ">= 0", self.progress_reward)
        _check(self.demo_order in DEMO_ORDERS, "demo_order", "|".join(DEMO_ORDERS), self.demo_order)

    def record(self) -> dict:
        """The fields as JSON-ready values, the run-time knobs only when set (see :func:`config_record`)."""
        return config_record(self, (*DYNAMICS_FIELDS, "demo_order"))


DYNAMICS_FIELDS = ("flaky_test_p", "progress_reward")
"""Fields that change how a task's runs behave (see :mod:`compactrl.tasksets.generators.dynamics`),
not what the generated project holds."""
DEMO_ORDERS = ("fixed", "shuffled")
"""Values of :attr:`CodeTaskConfig.demo_order` (recorded in a task's ``metadata["config"]`` only when
not ``fixed``, so the other presets' tasks serialise as before the knob existed)."""


def _check(ok: bool, name: str, expected: str, got: object) -> None:
    if not ok:
        raise ValueError(f"CodeTaskConfig.{name}: expected {expected}, got {got!r}")


PRESETS: dict[str, CodeTaskConfig] = {
    # The main job's tasks: easy's layout, the fact in the config file, and only facts whose stated
    # value is the constant verbatim (a one-token integer): finding the line and copying its value is all.
    "tiny": CodeTaskConfig(
        name="tiny", num_modules=1, num_docs=0, file_lines=(5, 8), num_facts=1,
        fact_depth=(0.0, 1.0), distractors_per_fact=1, max_turns=12,
        locations=("config",), fact_keys=("PAGE_SIZE", "MAX_RETRIES", "MAX_USERNAME_LENGTH", "BATCH_SIZE", "LOW_STOCK_THRESHOLD"),
    ),
    # A tiny model learns this on CPU: a few short files, one fact, one distractor.
    "easy": CodeTaskConfig(
        name="easy", num_modules=1, num_docs=0, file_lines=(6, 14), num_facts=1,
        fact_depth=(0.0, 1.0), distractors_per_fact=1, max_turns=12,
    ),
    "default": CodeTaskConfig(name="default"),
    "hard": CodeTaskConfig(
        name="hard", num_modules=8, num_docs=4, file_lines=(150, 300), num_facts=4,
        fact_depth=(0.6, 0.95), distractors_per_fact=4, max_turns=80,
    ),
    # tiny's files, layout and facts, and half of all test runs flake: a flaked submit must be
    # repeated, so the return after a summary is noisy for reasons no summary controls, and the
    # repeats lengthen the chains (measured: docs/environments.md).
    "long_noisy": CodeTaskConfig(
        name="long_noisy", num_modules=1, num_docs=0, file_lines=(5, 8), num_facts=1,
        fact_depth=(0.0, 1.0), distractors_per_fact=1, max_turns=10,
        locations=("config",), fact_keys=("PAGE_SIZE", "MAX_RETRIES", "MAX_USERNAME_LENGTH", "BATCH_SIZE", "LOW_STOCK_THRESHOLD"),
        flaky_test_p=0.5,
    ),
    # Trace counts that vary within a group by the agent's own choices: tiny's one-token facts, but
    # stated in the config, a docs page or a module docstring, among 9 candidate files read in a
    # shuffled order by the demonstrators, so one task's episodes find the fact after 1 to 9 views
    # and compact 0 to 5+ times; the fact found early must survive every summary until the fix, and
    # a fifth of the test runs flake (docs/environments.md has the measured chain lengths).
    "variable_chain": CodeTaskConfig(
        name="variable_chain", num_modules=3, num_docs=2, file_lines=(5, 8), num_facts=1,
        fact_depth=(0.0, 1.0), distractors_per_fact=1, max_turns=16,
        fact_keys=("PAGE_SIZE", "MAX_RETRIES", "MAX_USERNAME_LENGTH", "BATCH_SIZE", "LOW_STOCK_THRESHOLD"),
        flaky_test_p=0.2, demo_order="shuffled",
    ),
}


def preset(difficulty: str | CodeTaskConfig) -> CodeTaskConfig:
    """The config of a preset name (``tiny``, ``easy``, ``default``, ``hard``, ``long_noisy``,
    ``variable_chain``), or
    ``difficulty`` itself."""
    return resolve_preset(difficulty, PRESETS, CodeTaskConfig)


@dataclass
class _Fact:
    spec: FactSpec
    location: str
    stated: str
    value: object
    wrong: object
    file: str
    distractors: list[tuple[str, str, str]] = field(default_factory=list)  # (file, location, stated)


class CodeTaskGenerator(SeededGenerator[CodeTaskConfig]):
    """``generate(seed) -> Task``, pure and reproducible; see the module docstring."""

    def __init__(self, config: CodeTaskConfig | str = "default") -> None:
        super().__init__(preset(config), PRESETS, _generate, cache_size=1024)


# ----------------------------------------------------------------------------------------------
# generation


def _generate(cfg: CodeTaskConfig, label: str, seed: int) -> Task:
    rng = random.Random(f"compactrl-code:{seed}")
    pkg = rng.choice(PACKAGES)
    bug = rng.choice(BUG_MODULES)
    others = rng.sample(MODULES, cfg.num_modules)
    doc_files = ["README.md"] + [f"docs/{t}.md" for t in rng.sample(DOC_TOPICS, cfg.num_docs)]
    module_files = [f"{pkg}/{m}.py" for m in others]
    bug_file = f"{pkg}/{bug}.py"
    hosts = {"config": [CONFIG_FILE], "doc": doc_files, "docstring": module_files}
    catalogue = [spec for spec in CATALOGUE if not cfg.fact_keys or spec.key in cfg.fact_keys]
    facts = [_choose_fact(rng, cfg, spec, hosts) for spec in rng.sample(catalogue, cfg.num_facts)]
    facts.sort(key=lambda f: f.spec.key)

    files: dict[str, str] = {}
    tests: dict[str, dict] = {}
    imports: dict[str, list[str]] = {f"{pkg}/__init__.py": []}
    files[f"{pkg}/__init__.py"] = f'"""{pkg}: a small service library."""\n\n__version__ = "{rng.randint(0, 3)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"\n'
    for module, path in zip(others, module_files):
        lines, blocks = _module(rng, cfg, pkg, module, header_imports=[])
        files[path] = _insert_statements(rng, cfg, path, lines, facts, "docstring")
        imports[path] = [f"{pkg}/__init__.py"]
        _visible_tests(pkg, module, path, blocks, files, tests, imports)
    helper = others[0]
    helper_name = next(n for n in _names_in(files[module_files[0]]))
    bug_lines, bug_blocks = _module(rng, cfg, pkg, bug, header_imports=[f"from {pkg}.{helper} import {helper_name}  # noqa: F401  (re-exported)"], facts=facts)
    files[bug_file] = "\n".join(bug_lines) + "\n"
    imports[bug_file] = [f"{pkg}/__init__.py", module_files[0]]
    _visible_tests(pkg, bug, bug_file, bug_blocks, files, tests, imports)
    spec_file = f"tests/test_{bug}_spec.py"
    spec_source = _spec_tests(pkg, bug, facts)
    for fact in facts:
        tests[f"{spec_file}::test_{fact.spec.func_name}"] = {"file": spec_file, "imports": [bug_file], "facts": [fact.spec.key]}
    for path in doc_files:
        lines = _doc_file(rng, cfg, pkg, path, doc_files, module_files)
        files[path] = _insert_statements(rng, cfg, path, lines, facts, "doc")
    files[CONFIG_FILE] = _insert_statements(rng, cfg, CONFIG_FILE, _config_file(rng, cfg, pkg), facts, "config")
    files["pyproject.toml"] = f'[project]\nname = "{pkg}"\nversion = "1.0.0"\nrequires-python = ">=3.10"\n'
    for test in tests.values():  # every module a test's imports reach (the sim reads it per run)
        test["reach"] = _closure(test["imports"], imports)
    files = dict(sorted(files.items()))
    visible_tests = {p: c for p, c in files.items() if p.startswith("tests/")}
    meta_facts = [_fact_metadata(f, files) for f in facts]
    return Task(
        id=f"code-{label}-{seed}",
        kind="code",
        instruction=_instruction(pkg, bug_file, facts),
        files=files,
        check=Check(
            kind="pytest",
            must_pass=tuple(sorted(tests)),
            hidden_files={spec_file: spec_source, **visible_tests},
        ),
        max_turns=cfg.max_turns,
        source="generated",
        metadata={
            "generator": "code",
            "version": 1,
            "seed": seed,
            "split": split_of_seed(seed),
            "config": cfg.record(),
            "package": pkg,
            "bug_file": bug_file,
            "spec_file": spec_file,
            "facts": meta_facts,
            "fix": [
                {"file": bug_file, "old": f"{f.spec.key} = {f.wrong!r}\n", "new": f"{f.spec.key} = {f.value!r}\n"}
                for f in facts
            ],
            "sim": {"modules": imports, "tests": tests, "sites": _sites(bug_lines, facts)},
            **_dynamics(cfg, pkg, spec_file, facts),
        },
    )


def _dynamics(cfg: CodeTaskConfig, pkg: str, spec_file: str, facts: list[_Fact]) -> dict:
    """The ``dynamics`` metadata of a task whose runs are flaky or rewarded per fact (else nothing)."""
    if cfg.flaky_test_p == 0.0 and cfg.progress_reward == 0.0:
        return {}
    return {"dynamics": {
        "flaky_test_p": cfg.flaky_test_p,
        "flaky_test": f"tests/test_{pkg}_timing.py::test_scheduler_latency",
        "progress_reward": cfg.progress_reward,
        "progress_tests": [f"{spec_file}::test_{f.spec.func_name}" for f in facts],
    }}


def _closure(start: list[str], graph: dict[str, list[str]]) -> list[str]:
    seen, todo = set(start), list(start)
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(seen)


def _sites(lines: list[str], facts: list[_Fact]) -> list[dict]:
    """Where the bug file assigns each fact constant (0-based line) and the module-level names bound
    before it, so the sim can judge edits of those lines without parsing the module."""
    assignments = {f"{f.spec.key} = {f.wrong!r}": f.spec.key for f in facts}
    sites, bound = [], []
    for i, line in enumerate(lines):
        if line in assignments:
            sites.append({"key": assignments[line], "line": i, "names_before": sorted(bound)})
            bound.append(assignments[line])
        else:
            match = re.match(r"(?:def|class) (\w+)|from \S+ import (\w+)", line)
            if match:
                bound.append(match.group(1) or match.group(2))
    return sites


def _choose_fact(rng: random.Random, cfg: CodeTaskConfig, spec: FactSpec, hosts: dict[str, list[str]]) -> _Fact:
    location = rng.choice([loc for loc in cfg.locations if hosts[loc]])
    stated = rng.choice(spec.values)
    others = [v for v in spec.values if v != stated]
    wrong_values = [others[i % len(others)] for i in range(max(1, cfg.distractors_per_fact))]
    rng.shuffle(wrong_values)
    fact = _Fact(spec, location, stated, code_value(spec.transform, stated),
                 code_value(spec.transform, wrong_values[0]), rng.choice(hosts[location]))
    for stated_wrong in wrong_values[: cfg.distractors_per_fact]:
        loc = rng.choice([loc for loc in cfg.locations if hosts[loc]])
        fact.distractors.append((rng.choice(hosts[loc]), loc, stated_wrong))
    return fact


def _names_in(source: str) -> list[str]:
    return re.findall(r"^(?:def|class) (\w+)", source, flags=re.M)


def _fill(rng: random.Random, target: int, used: set[str], lines: list[str]) -> list[Block]:
    """Append filler functions to ``lines`` until it has ``target`` lines; returns their blocks."""
    blocks = []
    while len(lines) < target:
        block = _func(rng, used, rng.randrange(1000))
        if not block.lines:
            continue
        block.slots = [len(lines) + 2 + s for s in block.slots]
        lines += ["", ""] + block.lines
        blocks.append(block)
    return blocks


def _module(rng, cfg, pkg, module, header_imports, facts=()):
    target = rng.randint(*cfg.file_lines)
    summary = doc_paragraph(rng)[0]
    lines = [f'"""{module.capitalize()} helpers of {pkg}.', "", summary, '"""']
    if header_imports:
        lines += [""] + header_imports
    used: set[str] = set()
    blocks: list[Block] = []
    fact_positions = sorted(rng.randint(0, max(0, target // 20)) for _ in facts)
    for i, fact in enumerate(facts):
        while len(blocks) < fact_positions[i]:
            blocks += _fill(rng, len(lines) + 1, used, lines)
        lines += ["", "", f"{fact.spec.key} = {fact.wrong!r}", "", ""] + fact.spec.function.split("\n")
    blocks += _fill(rng, target, used, lines)
    return lines, blocks


def _visible_tests(pkg, module, path, blocks, files, tests, imports) -> None:
    chosen = [b for b in blocks if b.tests][:3]
    if not chosen:
        return
    test_file = f"tests/test_{module}.py"
    names = sorted(n for b in chosen for n in b.names)
    body = [f'"""Tests of {pkg}.{module}."""', "", f"from {pkg}.{module} import {', '.join(names)}"]
    for block in chosen:
        for name, test in block.tests:
            body += ["", "", f"def {name}():", test.rstrip("\n")]
            tests[f"{test_file}::{name}"] = {"file": test_file, "imports": [path], "facts": []}
    files[test_file] = "\n".join(body) + "\n"


def _spec_tests(pkg, bug, facts) -> str:
    names = sorted(f.spec.func_name for f in facts)
    out = [f'"""Specification tests of {pkg}.{bug}."""', "", "import pytest", "", f"from {pkg}.{bug} import {', '.join(names)}"]
    for fact in facts:
        out += ["", "", f"def test_{fact.spec.func_name}():", fact.spec.test(fact.value).rstrip("\n")]
    return "\n".join(out) + "\n"


def _doc_file(rng, cfg, pkg, path, doc_files, module_files) -> list[str]:
    target = rng.randint(*cfg.file_lines)
    if path == "README.md":
        lines = [f"# {pkg}", "", f"{pkg} is a small service library. " + doc_paragraph(rng)[0], ""]
        lines += ["Layout:", ""] + [f"- `{p}`" for p in module_files + doc_files[1:] + [CONFIG_FILE]] + [""]
    else:
        title = path.rsplit("/", 1)[-1].removesuffix(".md").capitalize()
        lines = [f"# {title}", ""]
    slots = [len(lines) - 1]
    while len(lines) < target:
        block = doc_block(rng)
        slots += [len(lines) + s for s in block.slots]
        lines += block.lines
    return _with_slots(lines, slots)


def _config_file(rng, cfg, pkg) -> list[str]:
    target = rng.randint(*cfg.file_lines)
    lines = [f"# Defaults of {pkg}. The code mirrors these values; this file is authoritative.", ""]
    slots: list[int] = []
    used: set[str] = set()
    sections = iter(rng.sample(MODULES, len(MODULES)) * 4)
    while len(lines) < target or not slots:
        block = config_block(rng, next(sections), used)
        slots += [len(lines) + s for s in block.slots]
        lines += block.lines
    return _with_slots(lines, slots)


class _Lines(list):
    """A list of lines that remembers its insertion slots (line index -> indent of inserted lines)."""

    slots: dict[int, str]


def _with_slots(lines: list[str], slots: list[int], indent: str = "") -> _Lines:
    out = _Lines(lines)
    out.slots = {s: indent for s in slots}
    return out


def _module_slots(lines: list[str]) -> _Lines:
    """Slots of a module: inside the module docstring and every multi-line function docstring."""
    out = _Lines(lines)
    out.slots = {2: ""}  # before the module docstring's summary line (see ``_module``)
    for i, line in enumerate(lines[:-1]):
        opens_docstring = line.startswith('    """') and len(line) > 7 and not line.endswith('"""', 7)
        if opens_docstring and lines[i + 1] == "":
            out.slots[i + 2] = "    "
    return out


def _insert_statements(rng, cfg, path, lines, facts, location) -> str:
    """Insert the facts and distractors that live in ``path`` at their depths; return the text."""
    if location == "docstring":
        lines = _module_slots(lines)
    inserts = []
    for fact in facts:
        template_by_loc = fact.spec.statements
        if fact.file == path and fact.location == location:
            inserts.append((rng.uniform(*cfg.fact_depth), render(template_by_loc[location][0], fact.spec, fact.stated)))
        templates = list(fact.spec.distractors.get(location, ()))
        rng.shuffle(templates)
        for i, (file, loc, stated) in enumerate(fact.distractors):
            if file == path and loc == location and templates:
                inserts.append((rng.random(), render(templates[i % len(templates)], fact.spec, stated)))
    n = len(lines)
    slots = sorted(lines.slots)
    placed = sorted(((min(slots, key=lambda s: abs(s - depth * n)), text) for depth, text in inserts),
                    key=lambda p: -p[0])
    out = list(lines)
    for slot, text in placed:
        out.insert(slot, lines.slots[slot] + text)
    return "\n".join(out) + "\n"


def _fact_metadata(fact: _Fact, files: dict[str, str]) -> dict:
    pattern = fact.spec.statements[fact.location][1]
    regex = re.compile(pattern)
    hits = [(p, i + 1) for p, text in files.items() for i, line in enumerate(text.split("\n")) if regex.search(line)]
    if len(hits) != 1 or hits[0][0] != fact.file:
        raise RuntimeError(f"fact {fact.spec.key}: pattern {pattern!r} matches {hits}, expected one line in {fact.file}")
    distractors = []
    for file, loc, stated in fact.distractors:
        for i, line in enumerate(files[file].split("\n")):
            templates = fact.spec.distractors.get(loc, ())
            if any(line.strip() == render(t, fact.spec, stated) for t in templates):
                distractors.append({"file": file, "line": i + 1, "stated": stated})
                break
    return {
        "key": fact.spec.key,
        "compare": fact.spec.compare,
        "transform": fact.spec.transform,
        "location": fact.location,
        "file": fact.file,
        "line": hits[0][1],
        "pattern": pattern,
        "stated": fact.stated,
        "value": fact.value,
        "wrong_value": fact.wrong,
        "function": fact.spec.func_name,
        "distractors": distractors,
    }


def _instruction(pkg: str, bug_file: str, facts: list[_Fact]) -> str:
    funcs = ", ".join(f"`{f.spec.func_name}`" for f in facts)
    return (
        f"Tests fail: {funcs} in `{bug_file}` give wrong results. The constants they use must match "
        "the values stated in the config, the docs or other modules' docstrings (beware of outdated "
        "look-alike values). Fix them."
    )


def with_overrides(config: CodeTaskConfig, **overrides) -> CodeTaskConfig:
    """A copy of ``config`` with fields replaced (validated)."""
    return replace(config, **overrides)
