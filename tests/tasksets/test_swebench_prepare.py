"""``compactrl tasks prepare`` on the fixture repository, offline: a real git work tree at the row's
base_commit, a real venv made by this machine's interpreter, the harness spec's install step run in
the work tree (it writes a generated ``_version.py`` and an editable ``.pth`` naming the work tree,
as ``pip install -e .`` does), then the loader and the local sandbox on what it wrote. Every bad
input is an error that names the instance and the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from loader_helpers import SWEBENCH_ROWS, local_unavailable

from compactrl.cli import main
from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.swebench import prepare as sp
from compactrl.tasksets.swebench.rows import SWEBenchConfig, load_specs, load_swebench, read_rows

pytestmark = pytest.mark.timeout(300)

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
IID = "mathkit-dev__mathkit-17"
def _install_command() -> str:
    dev_site = next(p for p in sys.path if p.endswith("site-packages"))
    code = ("import os, site; sp = site.getsitepackages()[0]; "
            "open('mathkit/_version.py', 'w').write('version = 3\\n'); "
            "open(os.path.join(sp, '__editable__.mathkit.pth'), 'w').write(os.getcwd() + '\\n'); "
            f"open(os.path.join(sp, 'devtools.pth'), 'w').write({dev_site!r} + '\\n')")
    return f"python -c {json.dumps(code)}"


def _harness(tmp_path, **spec_change) -> str:
    spec = {"python": VERSION, "install": _install_command(), "test_cmd": "pytest -rA", **spec_change}
    path = tmp_path / "harness.json"
    path.write_text(json.dumps({"specs": {"mathkit-dev/mathkit": {"0.3": spec}}, "reqs_paths": {}}))
    return str(path)


def _rows(tmp_path, **change) -> str:
    row = {**read_rows(SWEBENCH_ROWS)[0], **change}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def _config(tmp_path, repos_root: str, **change) -> sp.PrepareConfig:
    return sp.PrepareConfig(repos_root=repos_root, envs_root=str(tmp_path / "prepared"),
                            harness_specs=change.pop("harness_specs", None) or _harness(tmp_path), **change)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, repos_root):
    tmp = tmp_path_factory.mktemp("prepare")
    config = _config(tmp, repos_root)
    return tmp, config, sp.prepare(_rows(tmp), config)


def test_prepare_builds_the_env_the_work_tree_and_the_specs(prepared) -> None:
    tmp, config, report = prepared
    assert report.failed == {} and list(report.prepared) == [IID]
    rec = report.prepared[IID]
    assert rec["python_version"] == VERSION and rec["python_fallback"] is False
    out = subprocess.run([rec["python"], "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    # the row's own copy of the (repo, version) venv, which the install step may change
    assert out.stdout.strip() == os.path.join(os.path.abspath(config.envs_root), "envs", IID)
    base = os.path.join(os.path.abspath(config.envs_root), "envs", "mathkit-dev__mathkit@0.3")
    assert not [n for n in os.listdir(os.path.join(base, "lib", f"python{VERSION}", "site-packages")) if n.endswith(".pth")]
    head = subprocess.run(["git", "-C", rec["checkout"], "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.stdout.strip() == read_rows(SWEBENCH_ROWS)[0]["base_commit"]
    assert rec["generated_files"] == ["mathkit/_version.py"]
    # the editable .pth now names the sandbox's work dir, not the host's work tree
    assert rec["relocated"] == ["__editable__.mathkit.pth"]
    site = subprocess.run([rec["python"], "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True).stdout.strip()
    assert open(os.path.join(site, "__editable__.mathkit.pth")).read() == "/workspace\n"
    specs = load_specs(report.specs_path)
    # the harness's own test command, run with the row's environment first on PATH
    assert specs["mathkit-dev/mathkit@0.3"] == {"test_command": "pytest -rA {test_files}"}
    assert specs[IID] == {"python": rec["python"], "checkout": rec["checkout"], "generated_files": ["mathkit/_version.py"]}
    manifest = json.load(open(report.manifest_path))
    assert manifest["instances"][IID]["commands"] == [_install_command()]


def test_the_loader_reads_the_work_tree_and_its_generated_files(prepared, repos_root) -> None:
    tmp, _, report = prepared
    specs = load_specs(report.specs_path)
    (task,) = load_swebench(_rows(tmp), SWEBenchConfig(repos_root=repos_root, specs=specs))
    assert task.files["mathkit/_version.py"] == "version = 3\n"
    assert task.runtime.python == report.prepared[IID]["python"]
    assert task.origin["repo_path"] == report.prepared[IID]["checkout"]


def test_gold_succeeds_and_noop_fails_in_the_prepared_env(prepared, repos_root) -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())
    tmp, _, report = prepared
    (task,) = load_swebench(_rows(tmp), SWEBenchConfig(repos_root=repos_root, specs=load_specs(report.specs_path)))
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"].get("test_summary")
    assert not noop["success"] and "FAILED tests/test_stats.py::test_median_even" in noop["info"]["test_summary"]


def test_a_prepared_env_and_work_tree_are_reused(prepared) -> None:
    tmp, config, first = prepared
    stamp = os.path.join(first.prepared[IID]["checkout"], sp.STAMP)
    before = os.stat(stamp).st_mtime_ns
    again = sp.prepare(_rows(tmp), config).prepared[IID]
    assert again["env_reused"] and again["reused"] and os.stat(stamp).st_mtime_ns == before


def test_an_interrupted_env_is_built_again_and_so_are_its_rows(tmp_path, repos_root) -> None:
    config = _config(tmp_path, repos_root)
    env_dir = os.path.join(config.envs_root, "envs", "mathkit-dev__mathkit@0.3")
    os.makedirs(env_dir)
    open(os.path.join(env_dir, "half-written"), "w").close()  # no stamp: a build that died
    rec = sp.prepare(_rows(tmp_path), config).prepared[IID]
    assert not rec["env_reused"] and not os.path.exists(os.path.join(env_dir, "half-written"))
    os.remove(os.path.join(env_dir, sp.STAMP))  # the env dies again: its rows' copies are stale
    again = sp.prepare(_rows(tmp_path), config).prepared[IID]
    assert not again["env_reused"] and not again["reused"]


def test_a_failing_install_names_the_instance_and_the_command(tmp_path, repos_root) -> None:
    config = _config(tmp_path, repos_root, harness_specs=_harness(tmp_path, install="python -c 'raise SystemExit(3)'"))
    report = sp.prepare(_rows(tmp_path), config)
    assert report.prepared == {}
    assert IID in report.failed[IID] and "exited 3" in report.failed[IID] and "raise SystemExit(3)" in report.failed[IID]
    assert json.load(open(report.manifest_path))["failed"][IID] == report.failed[IID]


@pytest.mark.parametrize(("row_change", "message"), [
    ({"version": ""}, f"rows.jsonl:1: {IID}: version: missing or empty"),
    ({"repo": "nobody/nothing"}, f"{IID}: repo: no git repository for nobody/nothing"),
    ({"base_commit": "f" * 40}, f"{IID}: base_commit: {'f' * 40} is not a commit"),
])
def test_bad_rows_name_the_instance_and_the_field(tmp_path, repos_root, row_change, message) -> None:
    with pytest.raises(sp.PrepareError) as err:
        sp.prepare(_rows(tmp_path, **row_change), _config(tmp_path, repos_root))
    assert message in str(err.value)


def test_a_missing_or_conda_spec_fails_per_instance(tmp_path, repos_root) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"specs": {"psf/requests": {"2.0": {"python": "3.9"}}}}))
    report = sp.prepare(_rows(tmp_path), _config(tmp_path, repos_root, harness_specs=str(other)))
    assert f"{IID}: repo: 'mathkit-dev/mathkit' has no harness spec" in report.failed[IID]
    conda = _config(tmp_path, repos_root, harness_specs=_harness(tmp_path, packages="environment.yml"))
    # a conda environment.yml becomes its pip-installable dependencies; the row's commit has none
    assert "packages: none of ['environment.yml'] exists" in sp.prepare(_rows(tmp_path), conda).failed[IID]
    unknown = sp.prepare(_rows(tmp_path, version="9.9"), _config(tmp_path, repos_root)).failed[IID]
    assert f"{IID}: version: '9.9' of mathkit-dev/mathkit has no harness spec (known: ['0.3'])" in unknown


def test_instance_ids_not_in_the_rows_are_an_error(tmp_path, repos_root) -> None:
    with pytest.raises(sp.PrepareError, match=r"instance ids not in .*rows.jsonl: \['nope-1'\]"):
        sp.prepare(_rows(tmp_path), _config(tmp_path, repos_root, instance_ids=("nope-1",)))


def test_bad_configs_name_the_field(tmp_path) -> None:
    with pytest.raises(ValueError, match="PrepareConfig.repos_root: .* is not a folder"):
        sp.PrepareConfig(repos_root=str(tmp_path / "missing"), envs_root=str(tmp_path))
    with pytest.raises(ValueError, match="PrepareConfig.workdir: expected an absolute path"):
        sp.PrepareConfig(repos_root=str(tmp_path), envs_root=str(tmp_path), workdir="workspace")
    with pytest.raises(ValueError, match="PrepareConfig.harness_specs: no file"):
        sp.PrepareConfig(repos_root=str(tmp_path), envs_root=str(tmp_path), harness_specs=str(tmp_path / "x.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(sp.PrepareError, match="expected {'specs'"):
        sp.harness_specs(path=str(bad))


@pytest.mark.slow  # imports swebench in a subprocess (~9 s under load)
def test_swebench_5_is_named_as_lacking_the_specs() -> None:
    """The test extra pins swebench 5, which no longer ships the per-version specs."""
    import swebench.harness.constants as constants

    if hasattr(constants, "MAP_REPO_VERSION_TO_SPECS"):
        pytest.skip("this swebench still ships the specs")
    with pytest.raises(sp.PrepareError, match=r"has no MAP_REPO_VERSION_TO_SPECS .*swebench>=4,<5.*--harness-python"):
        sp.harness_specs()
    with pytest.raises(sp.PrepareError, match=r"cannot read the harness specs with .*swebench>=4,<5"):
        sp.harness_specs(python=sys.executable)


def test_a_missing_python_falls_back_to_the_nearest_or_fails_when_strict() -> None:
    with pytest.raises(sp.PrepareError, match=r"row 1: python: 3\.99 is not available here .*pyenv install 3\.99"):
        sp.choose_python("3.99", strict=True, where="row 1")
    path, used = sp.choose_python("3.99", strict=False, where="row 1")
    assert sp.probe_python(path)[1] == used and int(used.split(".")[1]) <= 14  # the newest one here
    assert sp.choose_python(VERSION, strict=True, where="row 1")[1] == VERSION


def test_requirements_inline_includes_and_drop_the_repository_itself(tmp_path) -> None:
    repo = tmp_path / "r"
    (repo / "requirements").mkdir(parents=True)
    (repo / "requirements" / "dev.txt").write_text("# dev\n-r tests.txt\n-e .\nblack==22.1\n")
    (repo / "requirements" / "tests.txt").write_text("pytest==7.0\n.[test]\n")
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x.invalid", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@x.invalid", "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    got = sp.requirements(str(repo), "o/r", commit, ["requirements/missing.txt", "requirements/dev.txt"], "row 1")
    assert got == ["pytest==7.0", "black==22.1"]
    with pytest.raises(sp.PrepareError, match=r"row 1: packages: none of the requirement files \['x.txt'\]"):
        sp.requirements(str(repo), "o/r", commit, ["x.txt"], "row 1")


def test_the_harness_test_command_becomes_a_template() -> None:
    assert sp.test_command("pytest --no-header -rA") == "pytest --no-header -rA {test_files}"
    assert sp.test_command("tox --current-env -epy39 -v --") == "tox --current-env -epy39 -v -- {test_files}"
    assert sp.test_command("bin/test -C --verbose") == "bin/test -C --verbose {test_files}"
    assert sp.test_command(None) is None


def test_the_cli_prepares_and_reports_bad_input_in_one_line(prepared, repos_root, capsys) -> None:
    tmp, config, _ = prepared
    rc = main(["tasks", "prepare", _rows(tmp), "--repos-root", repos_root, "--envs-root", config.envs_root,
               "--harness-specs", config.harness_specs])
    out = capsys.readouterr().out
    assert rc == 0 and f"ok   {IID}  mathkit-dev__mathkit@0.3  python {VERSION}  reused" in out
    with pytest.raises(SystemExit) as exc:
        main(["tasks", "prepare", _rows(tmp, version=""), "--repos-root", repos_root, "--envs-root", config.envs_root,
              "--harness-specs", config.harness_specs])
    assert exc.value.code == 2 and f"{IID}: version: missing or empty" in capsys.readouterr().err


def test_a_spec_checkout_that_is_gone_names_the_instance(tmp_path, repos_root) -> None:
    specs = {IID: {"checkout": str(tmp_path / "gone")}}
    with pytest.raises(ValueError, match=rf"rows.jsonl:1: {IID}: checkout: no folder .*gone \(run `compactrl tasks prepare`"):
        load_swebench(_rows(tmp_path), SWEBenchConfig(repos_root=repos_root, specs=specs))
    with pytest.raises(ValueError, match=r"checkout: expected a string, got 3"):
        SWEBenchConfig(repos_root=repos_root, specs={IID: {"checkout": 3}})


def test_a_missing_pinned_python_is_recorded_per_instance_or_fails_when_strict(tmp_path, repos_root) -> None:
    harness = _harness(tmp_path, python="3.99")
    rec = sp.prepare(_rows(tmp_path), _config(tmp_path, repos_root, harness_specs=harness)).prepared[IID]
    assert rec["python_requested"] == "3.99" and rec["python_fallback"] and rec["python_version"] != "3.99"
    assert sp.probe_python(rec["python"])[1] == rec["python_version"]  # the row's venv runs the fallback
    strict = _config(tmp_path / "strict", repos_root, harness_specs=harness, strict_python=True)
    assert f"{IID}: python: 3.99 is not available here" in sp.prepare(_rows(tmp_path), strict).failed[IID]
