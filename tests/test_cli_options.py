"""Every option of ``train``, ``eval``, ``tasks prepare`` and ``tasks validate`` either applies or is
refused with one line naming it (exit 2): never silently ignored.

The walk over each parser's options fails when an option is added without an entry in its
subcommand's table (:mod:`compactrl.cli_options`); for every option and a set of command lines
(generated env, each policy kind, each task-set kind, backends), giving it is accepted exactly where
its entry says it applies and otherwise refused with an error that names it.
"""

from __future__ import annotations

import argparse
import json

import pytest

from compactrl.cli import main
from compactrl.cli_options import given, refuse_ignored, undecided
from compactrl.eval import cli as eval_cli
from compactrl.eval import validate
from compactrl.eval.policies import PolicySpec
from compactrl.training import cli as train_cli

pytestmark = pytest.mark.timeout(120)

SWE_ROWS = "tests/fixtures/swebench/instances.jsonl"
TB_FOLDER = "tests/fixtures/terminal_bench_local"


def _parser(add) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compactrl")
    add(parser)
    return parser


def _subparser(name: str) -> argparse.ArgumentParser:
    from compactrl import cli_tasks

    parser = _parser(cli_tasks.add_arguments)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


SAMPLES = {"--policy": "noop"}


def _sample(action: argparse.Action) -> list[str]:
    """The option given with a value it accepts."""
    option = max(action.option_strings, key=len)
    if option in SAMPLES:
        return [option, SAMPLES[option]]
    if action.nargs == 0:
        return [option]
    if action.choices:
        return [option, str(list(action.choices)[-1])]
    if action.type in (int, float):
        return [option, "3"]
    if "kwargs" in action.dest:
        return [option, "{}"]
    return [option, "x"]


def _options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("records") / "tasks.jsonl"
    path.write_text(_task("t").to_json() + "\n")
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text("{}")
    return str(path)


def test_every_option_is_decided():
    """A new option fails this until its table says where it applies."""
    assert undecided(_parser(eval_cli.add_arguments), eval_cli.EVAL_OPTIONS) == []
    assert undecided(_subparser("validate"), validate.validate_options()) == []
    from compactrl.cli_tasks import PREPARE_OPTIONS

    assert undecided(_subparser("prepare"), PREPARE_OPTIONS) == []
    train = _parser(train_cli.add_arguments)
    assert undecided(train, train_cli.TRAIN_OPTIONS, [train_cli.CONFIG_FIELDS]) == []
    assert any(a.dest.startswith(train_cli.CONFIG_FIELDS) for a in train._actions)


def _walk(parser, table, bases, context_of):
    """For every option of ``table`` added to every base command line: refused, naming the option,
    iff some given option would not apply."""
    refused = applied = 0
    for base in bases:
        refuse_ignored(parser.parse_args(base), table, context_of(parser.parse_args(base)))  # defaults: never
        for action in _options(parser):
            if action.dest not in table:
                continue
            args = parser.parse_args([*base, *_sample(action)])
            assert action.dest in given(args), action.option_strings
            context = context_of(args)
            ignored = sorted(d for d in given(args) if table[d].test and not table[d].test(context))
            if not ignored:
                refuse_ignored(args, table, context)
                applied += 1
                continue
            with pytest.raises(ValueError) as exc:
                refuse_ignored(args, table, context)
            message = str(exc.value)
            name = max(parser._option_string_actions[f"--{ignored[0].replace('_', '-')}"].option_strings, key=len)
            assert message.startswith(f"{name} applies only "), message
            assert "\n" not in message
            refused += action.dest in ignored
    assert refused and applied


def test_eval_options_apply_or_are_refused(records, model_dir):
    parser = _parser(eval_cli.add_arguments)
    policies = ["oracle", "random", "gold", model_dir, "http://127.0.0.1:9"]
    bases = [["--policy", p] for p in policies]
    bases += [[*tasks, "--policy", p] for p in ("gold", model_dir) for tasks in (
        ["--tasks", SWE_ROWS], ["--tasks", SWE_ROWS, "--swebench-images", "--budget", "4096"],
        ["--tasks", TB_FOLDER], ["--tasks", TB_FOLDER, "--backend", "docker"], ["--tasks", records])]

    def context_of(args):
        return eval_cli.eval_context(args, PolicySpec(name=args.policy))

    _walk(parser, eval_cli.EVAL_OPTIONS, bases, context_of)


def test_validate_options_apply_or_are_refused(records):
    parser = _subparser("validate")
    bases = [[SWE_ROWS], [SWE_ROWS, "--swebench-images"], [TB_FOLDER], [TB_FOLDER, "--backend", "docker"], [records]]
    _walk(parser, validate.validate_options(), bases, validate.validate_context)


def test_prepare_and_train_options_apply_or_are_refused():
    from compactrl.cli_tasks import PREPARE_OPTIONS

    prepare = [["rows.jsonl", "--repos-root", "r", "--envs-root", "e", *more]
               for more in ([], ["--harness-specs", "s.json"], ["--resolver", "pip"])]
    _walk(_subparser("prepare"), PREPARE_OPTIONS, prepare, lambda args: args)
    train = [[], ["--config", "c.json"], ["--resume"]]
    _walk(_parser(train_cli.add_arguments), train_cli.TRAIN_OPTIONS, train, lambda args: args)


@pytest.mark.parametrize("argv, refused", [
    (["eval", "--policy", "random", "--summary-quality", "0.5"], "--summary-quality"),
    (["eval", "--policy", "oracle", "--temperature", "0.7"], "--temperature"),
    (["eval", "--policy", "gold", "--max-new-tokens", "64"], "--max-new-tokens"),
    (["eval", "--tokenizer", "tok"], "--tokenizer"),
    (["eval", "--served-model", "m"], "--served-model"),
    (["eval", "--tasks", SWE_ROWS, "--episodes", "2"], "--episodes"),
    (["eval", "--tasks", SWE_ROWS, "--repos-root", "r", "--env-kwargs", "{}"], "--env-kwargs"),
    (["eval", "--tasks", SWE_ROWS, "--repos-root", "r", "--max-compactions", "2"], "--max-compactions"),
    (["eval", "--tasks", SWE_ROWS, "--repos-root", "r", "--image-namespace", ""], "--image-namespace"),
    (["eval", "--tasks", TB_FOLDER, "--swebench-images"], "--swebench-images"),
    (["eval", "--tasks", TB_FOLDER, "--setup", "true"], "--setup"),
    (["eval", "--tasks", TB_FOLDER, "--image", "python:3.11"], "--image"),
    (["eval", "--tasks", SWE_ROWS, "--repos-root", "r", "--tb-grading", "pytest"], "--tb-grading"),
    (["eval", "--repos-root", "r"], "--repos-root"),
    (["eval", "--instance-ids", "a"], "--instance-ids"),
    (["tasks", "validate", SWE_ROWS, "--repos-root", "r", "--download-cache", "d"], "--download-cache"),
    (["tasks", "validate", TB_FOLDER, "--backend", "docker", "--download-cache", "d"], "--download-cache"),
    (["tasks", "validate", TB_FOLDER, "--swebench-specs", "s.json"], "--swebench-specs"),
    (["tasks", "prepare", "rows.jsonl", "--repos-root", "r", "--envs-root", "e", "--resolver", "pip",
      "--exclude-newer", "2024-01-01"], "--exclude-newer"),
    (["tasks", "prepare", "rows.jsonl", "--repos-root", "r", "--envs-root", "e", "--harness-specs", "s.json",
      "--harness-python", "python3"], "--harness-python"),
])
def test_an_ignored_option_is_one_line_naming_it(argv, refused, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"compactrl {argv[0]}: error: {refused} applies only "), err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv, refused", [
    (["--resume", "--algo", "grpo"], "--algo"),
    (["--resume", "--preset", "smoke"], "--preset"),
    (["--config", "c.json", "--preset", "smoke"], "--preset"),
])
def test_train_refuses_an_ignored_option(argv, refused, capsys):
    assert train_cli.run(_parser(train_cli.add_arguments).parse_args(argv)) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"compactrl train: error: {refused} applies only "), out


def test_turn_limit_and_budget_apply_on_the_generated_env(capsys):
    """The limit that ``--max-turns`` gives a task set holds on the generated env too (it once ran 29 turns)."""
    assert main(["eval", "--policy", "random", "--episodes", "2", "--max-turns", "3", "--budget", "4096",
                 "--max-compactions", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["config"]["env_kwargs"] == {"max_turns": 3, "budget": 4096, "reserve": 512, "max_compactions": 1}
    assert [(r["steps"], r["truncated"]) for r in printed["episodes"]] == [(3, True), (3, True)]


def test_an_option_given_twice_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--max-turns", "3", "--env-kwargs", '{"max_turns": 5}'])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("compactrl eval: error: --max-turns: also given in --env-kwargs")


def test_instance_ids_select_terminal_bench_folders_and_task_records(records):
    loaded = []

    def load(path):
        loaded.append(path)
        return [_task(path.rsplit("/", 1)[-1])]

    picked = eval_cli._load_ids(TB_FOLDER, ["sparse-file", "var-lib"], load)
    assert [t.id for t in picked] == ["sparse-file", "var-lib"]
    assert loaded == [f"{TB_FOLDER}/sparse-file", f"{TB_FOLDER}/var-lib"]  # only those are loaded (prepared)
    with pytest.raises(ValueError, match=r"--instance-ids: not in .*\['nope'\]"):
        eval_cli._load_ids(TB_FOLDER, ["nope"], load)
    from compactrl.task import Task

    tasks = [Task.from_json(line) for line in open(records)]
    assert eval_cli._load_ids(records, ["t"], lambda path: tasks) == tasks
    with pytest.raises(ValueError, match="--instance-ids"):
        eval_cli._load_ids(records, ["u"], lambda path: tasks)


def _task(task_id: str):
    from compactrl.task import Task

    return Task(id=task_id, kind="code", instruction="fix it", files={})
