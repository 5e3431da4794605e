"""evaluate() and `compactrl eval`."""

import json

import pytest

from compactrl.cli import main
from compactrl.envs.code_env import CodeRepoEnv
from compactrl.evaluation import aggregate, evaluate
from compactrl.policies.scripted import OraclePolicy, RandomPolicy

pytestmark = pytest.mark.timeout(120)


def test_evaluate_oracle_and_random():
    good = evaluate("CompactCode-v0", OraclePolicy(), episodes=4, seed=3, env_kwargs={"difficulty": "easy"}, num_envs=3,
                    return_episodes=True)
    assert good["success_rate"] == 1.0 and good["episodes"] == 4 and good["mean_format_errors"] == 0
    assert [e["episode"] for e in good["per_episode"]] == [0, 1, 2, 3]
    assert {"mean_turns", "mean_reward", "mean_tests_passed", "mean_steps"} <= set(good)
    bad = evaluate(CodeRepoEnv, RandomPolicy(seed=1), episodes=3, env_kwargs={"difficulty": "easy"})
    assert bad["success_rate"] <= 1.0 and bad["mean_format_errors"] > 0


def test_evaluate_is_reproducible_and_batch_size_free():
    runs = [evaluate(CodeRepoEnv, OraclePolicy(), episodes=3, seed=5, num_envs=n, return_episodes=True) for n in (1, 3)]
    for run in runs:
        run.pop("wall_s")
    assert runs[0] == runs[1]


def test_aggregate_takes_every_numeric_key():
    out = aggregate([{"episode": 0, "success": 1.0, "num_compactions": 2.0}, {"episode": 1, "success": 0.0}])
    assert out.items() >= {"episodes": 2, "mean_success": 0.5, "mean_num_compactions": 2.0, "success_rate": 0.5}.items()


def test_bad_arguments():
    with pytest.raises(ValueError, match="episodes"):
        evaluate(CodeRepoEnv, OraclePolicy(), episodes=0)


def test_cli_prints_one_json_object(capsys):
    code = main(["eval", "--env", "CompactCode-v0", "--policy", "oracle", "--episodes", "3", "--seed", "1",
                 "--env-kwargs", '{"difficulty": "easy"}', "--split", "test", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["success_rate"] == 1.0 and result["episodes"] == 3
    assert result["env_kwargs"] == {"difficulty": "easy", "split": "test"}
    for key in ("mean_turns", "mean_format_errors"):
        assert key in result
    assert main(["eval", "--policy", "random", "--episodes", "2", "--difficulty", "easy"]) == 0
    assert "success_rate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["eval", "--env-kwargs", "[1]"])
