"""The code-task generator: reproducible, splits disjoint, facts findable, sizes ordered."""

import ast
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.task import Task
from compactrl.tasksets.generators.code import (
    PRESETS,
    SPLITS,
    CodeTaskConfig,
    CodeTaskGenerator,
    GeneratedTasks,
    split_of_seed,
    task_seed_for,
)

pytestmark = pytest.mark.timeout(120)
GENERATORS = {name: CodeTaskGenerator(name) for name in PRESETS}
seeds = st.integers(0, 2**40)


@settings(max_examples=20)
@given(st.sampled_from(sorted(PRESETS)), seeds)
def test_generate_is_pure_and_serialisable(difficulty, seed):
    a = CodeTaskGenerator(difficulty).generate(seed)  # fresh generators: no shared cache
    b = CodeTaskGenerator(difficulty).generate(seed)
    assert a == b
    assert a.to_json() == b.to_json()
    assert Task.from_json(a.to_json()) == a
    json.dumps(a.metadata)


@settings(max_examples=20)
@given(st.sampled_from(sorted(PRESETS)), seeds)
def test_generated_project_is_well_formed(difficulty, seed):
    task = GENERATORS[difficulty].generate(seed)
    meta = task.metadata
    files = {**task.files, **task.check.hidden_files}
    for path, source in files.items():
        if path.endswith(".py"):
            ast.parse(source)
    assert meta["spec_file"] not in task.files  # the spec tests are hidden
    assert set(task.check.must_pass) == set(meta["sim"]["tests"])
    assert len(meta["facts"]) == PRESETS[difficulty].num_facts
    for fact in meta["facts"]:
        # the statement is findable by its pattern on exactly one line: the recorded one
        regex = re.compile(fact["pattern"])
        hits = [(p, i + 1) for p, text in task.files.items() for i, line in enumerate(text.split("\n")) if regex.search(line)]
        assert hits == [(fact["file"], fact["line"])]
        assert fact["file"] != meta["bug_file"]
        assert fact["value"] != fact["wrong_value"]
        assert f"{fact['key']} = {fact['wrong_value']!r}\n" in task.files[meta["bug_file"]]
        assert len(fact["distractors"]) == PRESETS[difficulty].distractors_per_fact
        for d in fact["distractors"]:
            assert d["stated"] in task.files[d["file"]].split("\n")[d["line"] - 1]


def test_sizes_grow_with_difficulty():
    def mean_chars(name):
        return sum(sum(map(len, GENERATORS[name].generate(s).files.values())) for s in range(20)) / 20

    easy, default, hard = mean_chars("easy"), mean_chars("default"), mean_chars("hard")
    assert easy < 4_000 < default < hard
    assert hard > 3 * default


@given(st.sampled_from(SPLITS), st.sampled_from(SPLITS), st.integers(0, 10**9), st.integers(0, 10**9))
def test_splits_are_disjoint(split_a, split_b, i, j):
    if split_a != split_b:
        assert task_seed_for(split_a, i) != task_seed_for(split_b, j)
    assert split_of_seed(task_seed_for(split_a, i)) == split_a


def test_held_out_split_reproducible_and_distinct():
    gen = GENERATORS["default"]
    test_a, test_b = GeneratedTasks(gen, "test"), GeneratedTasks(gen, "test")
    train = GeneratedTasks(gen, "train")
    assert [test_a.task(i) for i in range(5)] == [test_b.task(i) for i in range(5)]
    test_ids = {test_a.task(i).id for i in range(50)}
    assert not test_ids & {train.task(i).id for i in range(50)}
    assert all(test_a.task(i).metadata["split"] == "test" for i in range(5))


@pytest.mark.parametrize(
    "field, value",
    [("num_modules", 0), ("file_lines", (5, 2)), ("num_facts", 0), ("num_facts", 99), ("fact_depth", (0.5, 1.5)),
     ("distractors_per_fact", -1), ("locations", ("nowhere",)), ("locations", ()), ("max_turns", 0), ("num_docs", -1)],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CodeTaskConfig(**{field: value})


def test_unknown_split_and_difficulty_raise():
    with pytest.raises(ValueError, match="split"):
        task_seed_for("validation", 0)
    with pytest.raises(ValueError, match="difficulty"):
        CodeTaskGenerator("medium")


def test_custom_config_label_and_locations():
    cfg = CodeTaskConfig(name="docsonly", locations=("doc",), num_facts=3)
    task = CodeTaskGenerator(cfg).generate(7)
    assert task.id.startswith("code-docsonly-")
    assert all(f["location"] == "doc" and f["file"].endswith(".md") for f in task.metadata["facts"])


@given(seeds)
def test_fact_keys_restrict_the_catalogue(seed):
    keys = PRESETS["tiny"].fact_keys
    meta = GENERATORS["tiny"].generate(seed).metadata
    assert {f["key"] for f in meta["facts"]} <= set(keys)
    assert all(str(f["value"]) == f["stated"] for f in meta["facts"])  # tiny: the value is copied verbatim


def test_fact_keys_are_validated():
    with pytest.raises(ValueError, match="fact_keys"):
        CodeTaskConfig(fact_keys=("NO_SUCH_KEY",))
    with pytest.raises(ValueError, match="num_facts"):
        CodeTaskConfig(fact_keys=("PAGE_SIZE",), num_facts=2)
