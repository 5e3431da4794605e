"""The training loop end to end (smoke preset), its run directory, and resume after a kill."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compactrl.training.config import override, preset
from compactrl.training.rollouts import SummaryRouter
from compactrl.training.run_dir import RunDir
from compactrl.training.sft import model_log_probs
from compactrl.training.trainer import train

REPO = Path(__file__).resolve().parents[2]


def _smoke(**changes):
    return override(preset("smoke"), changes) if changes else preset("smoke")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_smoke_preset_runs_end_to_end_and_leaves_a_complete_run_dir(tmp_path, algo):
    cfg = _smoke(**{"rl.algo": algo})
    result = train(cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    rows = run.rows()
    assert [r["iteration"] for r in rows] == [0, 1, 2] and result.iterations == 2
    assert "eval/success_rate" in rows[0] and "sft/final_nll" in rows[0]
    assert all("train/traces_per_episode" in r and "loss/objective" in r for r in rows[2:])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["rl"]["algo"] == algo
    assert (tmp_path / "run" / "plots" / "curves.png").stat().st_size > 1000
    from compactrl.training.run_dir import CURVES

    logged = {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    for key, _title in CURVES:  # every curve the metrics hold a number of is drawn, and only those
        assert (tmp_path / "run" / "plots" / (key.replace("/", "_") + ".png")).exists() == (key in logged), key
    wanted = {"policy/clip_fraction", "policy/approx_kl"} | ({"loss/critic"} if algo == "ppo" else set())
    assert wanted <= logged & {k for k, _ in CURVES}
    if algo == "ppo":  # the critic is scored on the held-out traces at every evaluation
        assert all("eval/critic/trace_start_auc" in r for r in rows if "eval/success_rate" in r)
        assert (tmp_path / "run" / "plots" / "critic_calibration.png").exists()
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "sft_model" / "model.safetensors").exists()
    assert (tmp_path / "run" / "final_model" / "model.safetensors").exists()
    assert "sft/second_final_nll" in rows[0]  # the smoke preset runs both SFT phases
    state = run.load_checkpoint()
    assert state["iteration"] == 2 and state["rows"] == 3
    # the learner's state: a DCP directory named by the checkpoint, holding the critic exactly for PPO
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(run.learner_dir(state["learner_dir"]))).read_metadata().state_dict_metadata
    assert [p.name for p in (tmp_path / "run" / "learner").iterdir()] == [state["learner_dir"]]
    assert any(k.startswith("policy_model.") for k in saved) and any(k.startswith("policy_optim.") for k in saved)
    assert any(k.startswith("critic_model.") for k in saved) == (algo == "ppo")
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Held-out success" in report and "after RL minus after SFT" in report
    # the machine that gave these figures: commit, libraries, CPU and its kernels, threads
    (stamp,) = run.machines()
    assert rows[0]["provenance"] == stamp and stamp["resume"] is False
    assert stamp["libraries"]["torch"] == importlib.metadata.version("torch")
    assert stamp["threads"]["torch_intra_op"] == cfg.threads and stamp["cpu"]["model"]
    assert f"CPU: {stamp['cpu']['model']}" in report and "## Machine and software" in report
    assert "greedily (temperature 0)" in report and "sampled at temperature 1.0" in report
    # the final line names each phase's time, summed from the rows
    assert set(result.phase_s) == {"copy warm-up", "SFT", "critic pre-training", "RL", "evaluation"}
    assert result.phase_s["RL"] == pytest.approx(sum(r.get("time/iteration_s", 0.0) for r in rows))
    assert result.phase_s["SFT"] > 0 and result.phase_s["evaluation"] > 0
    assert (result.phase_s["critic pre-training"] > 0) == (algo == "ppo")
    line = result.summary_line()
    assert "SFT" in line and "RL" in line and "evaluation" in line and "2 RL iterations" in line
    if algo == "ppo":  # row 0 holds the critic pre-training (smoke: 1 step on one batch)
        assert rows[0]["pretrain/batches"] == 1.0 and "pretrain/loss/critic" in rows[0]


@pytest.mark.timeout(300)
def test_saved_batches_hold_each_iteration_with_its_routes(tmp_path):
    """``rollout.save_batches``: every policy iteration's batch on disk, after its update (advantages with
    it), with the sampler's routes ``[N, L, moe_layers, k]``."""
    from compactrl.policies.routing import moe_layer_indices
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.training.run_dir import RunDir

    cfg = _smoke(**{"rollout.save_batches": True})
    result = train(cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    m = cfg.model
    moe_layers = len(moe_layer_indices(tiny_moe(m.arch, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                                num_experts=m.num_experts, experts_per_token=m.experts_per_token)))
    for it in range(1, result.iterations + 1):
        batch = run.load_batch(it)
        n, length = batch["tokens"].shape
        assert batch["routed_experts"].shape == (n, length, moe_layers, m.experts_per_token)
        assert {"advantage", "sample_log_prob", "policy_mask"} <= set(batch.keys())
    assert sorted(p.name for p in (tmp_path / "run" / "batches").iterdir()) == [
        f"iter-{k}.pt" for k in range(1, result.iterations + 1)]


def test_the_smoke_preset_gives_identical_metrics_twice_on_one_machine(tmp_path):
    """Seeded end to end: two runs of one config on one machine write the same metrics, bit for bit,
    but for wall-clock times and the machine stamp (which holds no figure)."""
    cfg = _smoke()
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b")

    def figures(path):
        return [{k: v for k, v in row.items()
                 if not (k.startswith("time/") or "wall_clock" in k or k == "provenance")}
                for row in RunDir(path).rows()]

    first, second = figures(tmp_path / "a"), figures(tmp_path / "b")
    assert len(first) == 3 and "eval/success_rate" in first[-1] and "loss/objective" in first[-1]
    assert first == second


@pytest.mark.timeout(60)
def test_existing_run_dir_is_not_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a run"):
        train(_smoke(), tmp_path / "run")


def _marked_alive(mark: str) -> list[int]:
    """Live processes whose environment holds ``COMPACTRL_TEST_KILLED_RUN=mark``."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            entries = (d / "environ").read_bytes().split(b"\0") if d.name.isdigit() else []
            if f"COMPACTRL_TEST_KILLED_RUN={mark}".encode() in entries:
                if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(d.name))
        except OSError:
            continue
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [(1, 1), (2, 1)], ids=["one-process", "2-ranks-resumed-at-1"])
def test_killed_run_resumes_with_no_lost_or_duplicated_rows(tmp_path, ranks):
    """SIGKILL a CLI run mid-way (after iteration 2's row), then --resume it to two iterations past its checkpoint.

    The run is started with far more iterations than it can do within the test's timeout, so the kill
    always lands in a running run: there is no race with a run that ends on its own. The 2-rank run's
    learner (ranks on the local Ray it started) is resumed at 1 rank from its sharded checkpoint; every
    process the killed run started ends (Ray's own agents notice their node is gone within ~2 minutes).
    """
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "compactrl.cli", "train", "--preset", "smoke", "--out", str(out),
           "--no-progress", "--rl.iterations", "1000", "--eval.every", "2", "--learner.ranks", str(ranks[0])]
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COMPACTRL_TEST_KILLED_RUN": mark}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 200
    try:
        # bounded poll of the metrics file the run appends to: rows 0-2 written, so checkpoint 1 exists
        while time.monotonic() < deadline and proc.poll() is None and len(RunDir(out).rows()) < 3:
            time.sleep(0.05)
        assert proc.poll() is None, f"the run exited with {proc.returncode} before iteration 2's row"
        assert len(RunDir(out).rows()) >= 3, "no row for iteration 2 within 200 s"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL  # it died of the kill, it did not finish
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    killed_rows = RunDir(out).rows()
    covered = RunDir(out).load_checkpoint()["rows"]  # rows of the iterations the checkpoint holds
    assert 2 <= covered <= len(killed_rows)
    target = covered + 1  # the checkpoint holds iterations 0 .. covered - 1: two more
    resumed = subprocess.run([sys.executable, "-m", "compactrl.cli", "train", "--resume", "--out", str(out),
                              "--no-progress", "--rl.iterations", str(target), "--learner.ranks", str(ranks[1])],
                             cwd=REPO, env={**env, "COMPACTRL_TEST_KILLED_RUN": mark + "-resume"},
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = RunDir(out).rows()
    assert [r["iteration"] for r in rows] == list(range(target + 1))
    assert rows[:covered] == killed_rows[:covered]  # checkpointed iterations are kept, not redone
    assert RunDir(out).load_checkpoint()["iteration"] == target
    assert not list(out.glob(".*.tmp"))
    # each start is stamped: the first run and the resume, in that order
    assert [m["resume"] for m in RunDir(out).machines()] == [False, True]
    assert "## Machine and software (resume 1)" in (out / "report.md").read_text()
    assert json.loads((out / "config.json").read_text())["learner"]["ranks"] == ranks[1]
    assert [p.name for p in (out / "learner").iterdir()] == [f"iter-{target:06d}"]
    deadline = time.monotonic() + 180
    while _marked_alive(mark) and time.monotonic() < deadline:
        time.sleep(1)
    assert _marked_alive(mark) == [], "a process of the killed run outlived it"


@pytest.mark.timeout(300)
def test_a_finished_run_is_extended_by_resuming_with_more_iterations(tmp_path, capsys):
    from compactrl.training import cli as train_cli

    out = tmp_path / "run"
    train(_smoke(), out)  # the smoke preset: 2 iterations
    finished = RunDir(out).rows()
    with pytest.raises(ValueError, match="already done 2 iterations"):
        train(_smoke(), out, resume=True, iterations=1)
    with pytest.raises(ValueError, match="only a resumed run"):
        train(_smoke(), tmp_path / "new", iterations=3)
    assert not (tmp_path / "new").exists()
    parser = __import__("argparse").ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--resume", "--out", str(out), "--no-progress", "--rl.lr", "0.1"])
    assert train_cli.run(args) == 2 and "rl.lr" in capsys.readouterr().out  # only iterations may change
    args = parser.parse_args(["--resume", "--out", str(out), "--no-progress", "--rl.iterations", "3"])
    assert train_cli.run(args) == 0
    rows = RunDir(out).rows()
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert rows[:3] == finished  # the finished iterations are kept, not redone
    assert json.loads((out / "config.json").read_text())["rl"]["iterations"] == 3
    assert RunDir(out).load_checkpoint()["iteration"] == 3


@pytest.mark.timeout(60)
def test_resume_truncates_rows_written_after_the_last_checkpoint(tmp_path):
    run = RunDir(tmp_path)
    for i in range(4):
        run.append_row({"iteration": i, "x": float(i)})
    with open(run.metrics_path, "a") as fh:
        fh.write('{"iteration": 4, "x"')  # a row cut short by a kill
    assert [r["iteration"] for r in run.rows()] == [0, 1, 2, 3]
    run.truncate_rows(2)
    assert [r["iteration"] for r in run.rows()] == [0, 1]
    run.close()


@pytest.mark.timeout(120)
def test_sft_step_does_not_depend_on_the_micro_batch_budget():
    """Packing a step's traces into micro-batches changes the padding, not the loss or the update."""
    from tensordict import TensorDict

    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.sft import sft_train

    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([9, 30, 14, 22, 27, 11])
    mask = torch.arange(30)[None, :] < lengths[:, None]
    tokens = torch.randint(3, 4000, (6, 30), generator=g) * mask
    demos = TensorDict({"tokens": tokens, "attention_mask": mask,
                        "policy_mask": (torch.rand(6, 30, generator=g) < 0.4) & mask}, batch_size=[6])
    runs = []
    for budget in (10_000, 40):  # one forward pass, or one per 1-2 traces
        policy = TransformersPolicy(tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2,
                                             experts_per_token=1, seed=4), load_tokenizer())
        history = sft_train(policy, demos, steps=3, lr=1e-2, batch_traces=4, micro_batch_tokens=budget,
                            generator=torch.Generator().manual_seed(0))
        runs.append((torch.tensor([r["loss"] for r in history]),
                     torch.cat([p.detach().flatten() for p in policy.parameters()])))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-6)
    # the one-layer model's layer has experts (tiny_moe keeps the last layer MoE): the grouped expert
    # matmuls sum in another order per micro-batch, 1.4e-5 on 3 of 311k parameters after 3 steps
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-4, atol=3e-5)


def test_summary_router_sends_only_summary_requests_to_the_summarizer():
    from compactrl.types import PolicyRequest

    class Tag:
        def __init__(self, tag):
            self.tag, self.seen = tag, []

        def act(self, reqs):
            self.seen += reqs
            return [self.tag] * len(reqs)

    pol, summ = Tag("act"), Tag("sum")
    reqs = [PolicyRequest([], compaction_required=c) for c in (False, True, False, True)]
    assert SummaryRouter(pol, summ).act(reqs) == ["act", "sum", "act", "sum"]
    assert all(r.compaction_required for r in summ.seen) and not any(r.compaction_required for r in pol.seen)


@pytest.mark.timeout(300)
def test_copy_warmup_teaches_a_random_model_to_repeat_its_context():
    from tensordict import TensorDict

    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.sft import copy_warmup

    torch.manual_seed(0)
    policy = TransformersPolicy(tiny_moe("glm4_moe", hidden_size=64, num_layers=2, num_experts=2,
                                         experts_per_token=1), load_tokenizer())
    g = torch.Generator().manual_seed(0)
    text = torch.randint(3, 100, (8, 256), generator=g)  # a small vocabulary: every token is seen often
    demos = TensorDict({"tokens": text, "attention_mask": torch.ones_like(text)}, batch_size=[8])
    span = torch.randint(3, 100, (8, 12), generator=torch.Generator().manual_seed(1))  # fresh sequences
    probe = torch.cat([span, span], dim=1)
    select = torch.zeros_like(probe, dtype=torch.bool)
    select[:, 13:] = True

    def repeat_nll() -> float:
        with torch.no_grad():
            return float(-model_log_probs(policy, probe, torch.ones_like(probe), select).mean())

    before = repeat_nll()
    history = copy_warmup(policy, demos, steps=300, lr=3e-3, batch=16, span=12, prefix=4, generator=g)
    assert len(history) == 300
    assert repeat_nll() < 0.05 * before  # it copies sequences it never saw: not memorised text
    with pytest.raises(ValueError, match="demos"):
        short = TensorDict({"tokens": text[:1, :10], "attention_mask": torch.ones(1, 10)}, batch_size=[1])
        copy_warmup(policy, short, steps=1, lr=1e-3, span=12, prefix=4)


@pytest.mark.parametrize("truncation", ["terminal", "bootstrap_last"])
def test_a_truncated_episode_earns_its_final_reward_only_when_its_end_is_terminal(truncation):
    """``rl.truncation`` reaches GAE: with ``terminal`` a loop cut at the turn limit ends at its reward
    (0), so its last token's advantage is ``-V``; with ``bootstrap_last`` the critic values the end and
    the same token's advantage is 0 (at gamma = 1): the loop costs nothing."""
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.training.update import Updater
    from compactrl.types import Trace

    n = 6
    trace = Trace(list(range(3, 3 + n)), [False, True, True, False, True, True], [False] * n,
                  [-1.0] * n, {}, trace_index=0)
    batch = stack_traces([(EpisodeMeta(0, 0, False, True), [trace])])  # truncated, reward 0
    cfg = _smoke(**{"rl.truncation": truncation, "rl.whiten_advantages": False, "rl.lmbda": 1.0})

    class ConstantCritic(torch.nn.Linear):
        def value(self, tokens, mask):
            return torch.full(tokens.shape, 0.8)

    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import shared_tokenizer

    policy = TransformersPolicy(tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2,
                                         experts_per_token=1), shared_tokenizer())
    Updater(cfg.rl, policy, ConstantCritic(1, 1)).advantages(batch)
    last = batch["advantage"][0, n - 1].item()
    assert last == pytest.approx(-0.8 if truncation == "terminal" else 0.0)


def test_text_progress_prints_dated_lines_with_step_total_and_eta():
    """Output that is not a terminal gets plain lines as the run goes (not rich bars at the end)."""
    import io
    import re

    from compactrl.training.cli import TextProgress

    out = io.StringIO()
    progress = TextProgress(every_s=0.0, stream=out)
    bar = progress.add_task("SFT", total=3)
    for _ in range(3):
        progress.update(bar, advance=1, status="nll 1.000")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"\d\d:\d\d:\d\d  SFT  3/3  \d+s elapsed  ETA 0s  nll 1.000", lines[-1]), lines[-1]
    quiet = io.StringIO()
    slow = TextProgress(every_s=3600.0, stream=quiet)
    bar = slow.add_task("RL", total=5)
    for _ in range(5):
        slow.update(bar)
    # throttled: the first step (the phase has started) and the last
    assert [line.split("  ")[2] for line in quiet.getvalue().splitlines()] == ["1/5", "5/5"]


def test_plot_titles_say_how_each_success_curve_was_sampled(tmp_path):
    run = RunDir(tmp_path)
    run.create(_smoke().to_json(), resume=False)
    titles = run._titles()
    assert titles["eval/success_rate"] == "held-out success rate (greedy)"
    assert titles["train/success_rate"] == "training success rate (sampled, T=1)"
