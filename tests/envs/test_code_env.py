"""CodeRepoEnv: Gymnasium contract, robustness to any text, seeding, rewards, tools."""

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import compactrl  # noqa: F401  (registers the ids)
from compactrl.envs.code_env import CodeRepoEnv
from compactrl.registration import make_code_env
from compactrl.sandbox import SandboxError
from compactrl.tools import ToolCall, format_call

pytestmark = pytest.mark.timeout(120)


def test_check_env_passes():
    check_env(CodeRepoEnv(), skip_render_check=True)
    check_env(CodeRepoEnv(difficulty="easy", render_mode="ansi"))
    check_env(make_code_env().unwrapped, skip_render_check=True)
    env = gym.make("CompactCode-v0")
    check_env(env.unwrapped, skip_render_check=True)
    assert isinstance(env.unwrapped, CodeRepoEnv)


ENV = CodeRepoEnv(difficulty="easy")


@settings(max_examples=60)
@given(st.lists(st.one_of(st.text(max_size=200), st.sampled_from([
    "<tool>view README.md</tool>", "<tool>view . </tool>", "<tool>search def</tool>", "<tool>test</tool>",
    "<tool>create x/y.py\n<content>\nprint(1)\n</content>\n</tool>", "<tool>view ../../etc/passwd</tool>",
    "<tool>replace README.md\n<old>\n#\n</old>\n<new>\n\n</new>\n</tool>", "<tool>shell ls -la</tool>",
    "<tool>view /etc/passwd 1 2</tool>", "<tool>search \"\u0000\" /</tool>", "<tool>submit</tool>",
])), min_size=1, max_size=15), st.integers(0, 2**31))
def test_any_action_is_an_observation(actions, seed):
    obs, info = ENV.reset(seed=seed)
    assert ENV.observation_space.contains(obs)
    for i, action in enumerate(actions):
        assert ENV.action_space.contains(action)
        obs, reward, terminated, truncated, info = ENV.step(action)
        assert ENV.observation_space.contains(obs)
        assert reward in (0.0, 1.0)
        assert info["turn"] == i + 1 and info["task_id"] == ENV.task.id
        assert {"format_errors", "tool", "tool_errors"} <= set(info)
        if terminated or truncated:
            assert "success" in info and "test_summary" in info
            break


@settings(max_examples=10)
@given(st.sampled_from(["easy", "default", "hard"]), st.integers(0, 2**31))
def test_seeded_reset_reproduces(difficulty, seed):
    a, b = CodeRepoEnv(difficulty=difficulty), CodeRepoEnv(difficulty=difficulty)
    obs_a, info_a = a.reset(seed=seed)
    obs_b, info_b = b.reset(seed=seed)
    assert obs_a == obs_b and info_a == info_b and a.task == b.task
    assert a.step("<tool>view README.md 1 5</tool>") == b.step("<tool>view README.md 1 5</tool>")
    obs_c, _ = a.reset(seed=seed)
    assert obs_c == obs_a


def test_submitting_without_a_fix_gives_zero():
    env = CodeRepoEnv()
    for seed in range(5):
        env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step("<tool>submit</tool>")
        assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
        assert info["tests_failed"] >= 1
        with pytest.raises(RuntimeError):
            env.step("<tool>test</tool>")


def apply_fix(env):
    meta = env.task.metadata
    for fix in meta["fix"]:
        env.step(format_call(ToolCall("replace", path=fix["file"], old=fix["old"], new=fix["new"])))


def test_fix_then_submit_gives_one_and_truncation_grades_once():
    env = CodeRepoEnv()
    env.reset(seed=1)
    apply_fix(env)
    obs, reward, terminated, truncated, info = env.step("<tool>submit</tool>")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    env = CodeRepoEnv(max_turns=len(env.task.metadata["fix"]) + 1)
    env.reset(seed=1)
    apply_fix(env)
    obs, reward, terminated, truncated, info = env.step("thinking, no tool")
    assert (reward, terminated, truncated, info["success"]) == (1.0, False, True, True)


def test_a_simulated_episode_has_no_wall_clock_limit_unless_one_is_given(monkeypatch):
    """On ``sim`` a starved process must not change an episode's outcome: the task's wall-clock
    limit applies to real sandboxes only; an explicit ``time_limit_s`` applies everywhere."""
    import compactrl.envs.code_env as code_env

    now = [1000.0]
    monkeypatch.setattr(code_env.time, "monotonic", lambda: now[0])
    env = CodeRepoEnv()
    env.reset(seed=1)
    now[0] += 10 * env.task.time_limit_s  # far past the task's limit between two steps
    obs, reward, terminated, truncated, info = env.step("<tool>test</tool>")
    assert not truncated and not terminated
    limited = CodeRepoEnv(time_limit_s=5.0)
    limited.reset(seed=1)
    now[0] += 6.0
    obs, reward, terminated, truncated, info = limited.step("<tool>test</tool>")
    assert truncated and not terminated


def test_sandbox_failure_truncates_with_a_message():
    def broken(task, files):
        raise SandboxError("container vanished")

    env = CodeRepoEnv(sandbox_kwargs={"judge": broken})
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<tool>test</tool>")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["sandbox_error"] == "container vanished" and "sandbox failed" in obs


def test_tools_behave():
    env = CodeRepoEnv(difficulty="default", max_view_lines=10)
    obs, _ = env.reset(seed=3)
    meta = env.task.metadata
    bug = meta["bug_file"]
    n_lines = len(env.task.files[bug].rstrip("\n").split("\n"))
    obs = env.step(f"<tool>view {bug}</tool>")[0]
    assert obs.startswith(f"{bug} (lines 1-10 of {n_lines})") and f"view {bug} 11 20" in obs
    obs = env.step(f"<tool>view ./{bug} 2 3</tool>")[0]
    assert obs.split("\n")[1].startswith("   2\t") and len(obs.split("\n")) == 3
    assert env.step(f"<tool>view {bug} {n_lines + 5} {n_lines + 9}</tool>")[0].startswith("Error")
    fact = meta["facts"][0]
    key = fact["key"]
    obs = env.step(f"<tool>search {key}</tool>")[0]
    assert f"{bug}:" in obs and key in obs
    assert env.step("<tool>search zzz_not_there</tool>")[0].startswith("No matches")
    obs = env.step(f"<tool>view {meta['package']}</tool>")[0]
    assert "is a directory" in obs and bug in obs
    obs, _, _, _, info = env.step(f"<tool>replace {bug}\n<old>\nnot in the file\n</old>\n<new>\nx\n</new>\n</tool>")
    assert obs.startswith("Error") and info["tool_errors"] == 2
    obs = env.step("<tool>create notes/todo.md\n<content>\nremember\n</content>\n</tool>")[0]
    assert obs == "Created notes/todo.md (1 lines)."
    assert env.step("<tool>view notes/todo.md</tool>")[0] == "notes/todo.md (lines 1-1 of 1)\n   1\tremember"
    obs, _, _, _, info = env.step("<tool>view ../secret</tool>")
    assert obs.startswith("Error") and info["format_errors"] == 0
    obs, _, _, _, info = env.step("two calls <tool>test</tool><tool>test</tool>")
    assert obs.startswith("Format error") and info["format_errors"] == 1 and info["tool"] is None


def test_restricted_tools_and_bad_arguments():
    env = CodeRepoEnv(tools=("view", "submit"))
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<tool>test</tool>")
    assert "not available" in obs and info["format_errors"] == 1
    for kwargs, field in [({"backend": "vm"}, "backend"), ({"tools": ("view",)}, "tools"), ({"max_turns": 0}, "max_turns"),
                          ({"split": "dev"}, "split"), ({"difficulty": "insane"}, "difficulty"), ({"render_mode": "human"}, "render_mode")]:
        with pytest.raises(ValueError, match=field):
            CodeRepoEnv(**kwargs)


def test_observations_are_clipped_to_the_space():
    env = CodeRepoEnv(max_observation_chars=300, max_view_lines=1000)
    obs, _ = env.reset(seed=0)
    assert len(obs) <= 300
    obs = env.step("<tool>view README.md</tool>")[0]
    assert len(obs) == 300 and "characters clipped" in obs


def test_options_pick_a_task_and_split_is_held_out():
    train, test = CodeRepoEnv(split="train"), CodeRepoEnv(split="test")
    train.reset(options={"index": 4})
    test.reset(options={"index": 4})
    assert train.task.id != test.task.id and test.task.metadata["split"] == "test"
    other = CodeRepoEnv()
    other.reset(options={"task": test.task})
    assert other.task == test.task
    assert CodeRepoEnv(task_source=test.task).reset()[1]["task_id"] == test.task.id


def test_system_prompt_describes_the_tools():
    prompt = CodeRepoEnv().unwrapped.system_prompt
    for tool in ("view", "search", "replace", "create", "test", "shell", "submit"):
        assert f"<tool>{tool}" in prompt
    assert "shell" not in CodeRepoEnv(tools=("view", "submit")).system_prompt
    restricted = CodeRepoEnv(tools=("view", "submit")).system_prompt
    all_tools = ("view", "search", "replace", "create", "test", "shell", "submit")
    assert {t for t in all_tools if f"<tool>{t}" in restricted} == {"view", "submit"}  # only the env's tools


def test_one_factory_builds_both_ids_and_names_bad_arguments():
    from compactrl.envs.terminal_env import TerminalEnv
    from compactrl.registration import make_env
    from compactrl.wrappers import ContextBudget, ContextBudgetConfig

    for env_id, cls in (("CompactCode-v0", CodeRepoEnv), ("CompactTerminal-v0", TerminalEnv)):
        env = make_env(env_id, context_budget=ContextBudgetConfig(budget=4096), reserve=200, max_turns=3)
        assert isinstance(env, ContextBudget) and type(env.unwrapped) is cls
        assert (env.config.budget, env.config.reserve, env.unwrapped.max_turns) == (4096, 200, 3)
        assert type(make_env(env_id, context_budget=False)) is cls
    with pytest.raises(ValueError, match="env_id"):
        make_env("CompactChess-v0")
    with pytest.raises(ValueError, match="context_budget"):
        make_env("CompactCode-v0", context_budget=None, budget=4096)
    with pytest.raises(ValueError, match="context_budget"):
        make_env("CompactCode-v0", context_budget="yes")
