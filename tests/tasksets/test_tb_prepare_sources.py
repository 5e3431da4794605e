"""What a Terminal-Bench task's prepare fetches or makes writable for the local backend, offline here:
``git clone`` in a Dockerfile step from a git mirror (a local bare repository), ``npm ci``/``npm
install`` steps (the decision; the flow on a package with no dependencies), a step writing under
``/var/lib``, tests that move ``/tests``, and the reference solution's pip requirements in a
wheelhouse that noop does not see (a wheel made here, found through pip's own offline options).
Real local sandbox."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile

import pytest
from loader_helpers import FIXTURES, local_unavailable, write_tb_task

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.terminal_bench import local_build as tlb
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir

LOCAL = os.path.join(FIXTURES, "terminal_bench_local")
needs_local = pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))


def _git(*args: str, cwd: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _mirror(root) -> tuple[str, str]:
    """``root/git/github.com/acme/widgets.git``: a bare repository with one commit; (cache, commit)."""
    src = root / "src"
    src.mkdir()
    _git("init", "-q", "-b", "main", cwd=str(src))
    (src / "README").write_text("widgets v1\n")
    _git("add", "README", cwd=str(src))
    _git("commit", "-q", "-m", "first", cwd=str(src))
    bare = root / "cache" / "git" / "github.com" / "acme" / "widgets.git"
    bare.parent.mkdir(parents=True)
    _git("clone", "-q", "--bare", str(src), str(bare))
    for dirpath, _dirs, names in os.walk(root / "cache"):  # readable by the sandbox's user
        os.chmod(dirpath, 0o755)
        for n in names:
            os.chmod(os.path.join(dirpath, n), 0o644)
    return str(root / "cache"), _git("rev-parse", "HEAD", cwd=str(src))


def _clone_task(root) -> str:
    return write_tb_task(
        root / "clone-task", instruction="copy the README of widgets to /app/out.txt",
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY setup.sh ./\nRUN bash /app/setup.sh\n",
        solution="cp widgets/README /app/out.txt\ngit -C /app/widgets remote get-url origin > /app/origin.txt\n",
        tests="def test_out():\n    assert open('/app/out.txt').read() == 'widgets v1\\n'\n"
              "    assert open('/app/origin.txt').read().strip() == 'https://github.com/acme/widgets.git'\n",
        **{"setup.sh": "git clone https://github.com/acme/widgets.git\ncd widgets\ngit log --oneline\n"})


# ------------------------------------------------------------------------------------ git mirror
def test_mirror_paths_and_the_insteadof_configuration(tmp_path) -> None:
    cache, _commit = _mirror(tmp_path)
    mirror = os.path.join(cache, "git")
    repo = os.path.join(mirror, "github.com", "acme", "widgets.git")
    for url in ("https://github.com/acme/widgets.git", "https://github.com/acme/widgets", "git@github.com:acme/widgets.git",
                "ssh://git@github.com/acme/widgets.git"):
        assert tlb.git_mirror_path(url, mirror) == repo, url
    assert tlb.git_mirror_path("https://github.com/acme/other.git", mirror) is None
    assert tlb.git_mirror_path("https://github.com/acme/widgets.git", None) is None
    env = tlb.git_mirror_env(mirror)
    pairs = {(env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"]) for i in range(int(env["GIT_CONFIG_COUNT"]))}
    assert (f"url.{mirror}/github.com/.insteadOf", "https://github.com/") in pairs
    assert ("safe.directory", "*") in pairs
    # git itself rewrites the URL to the mirror (a clone on this machine, no network)
    out = subprocess.run(["git", "clone", "-q", "https://github.com/acme/widgets.git", str(tmp_path / "w")],
                         env={**os.environ, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "w" / "README").read_text() == "widgets v1\n"


def test_an_incomplete_or_unreadable_mirror_is_named(tmp_path) -> None:
    cache, commit = _mirror(tmp_path)
    repo = os.path.join(cache, "git", "github.com", "acme", "widgets.git")
    assert tlb.git_mirror_problem(repo) is None
    blob = _git("rev-parse", f"{commit}:README", cwd=repo)
    loose = os.path.join(repo, "objects", blob[:2], blob[2:])
    if not os.path.isfile(loose):  # a packed clone: unpack nothing, make the blob absent another way
        pytest.skip("the fixture clone packed its objects")
    os.remove(loose)
    assert f"lacks 1 object(s) its refs reach, e.g. {blob[:12]} (README at HEAD)" in tlb.git_mirror_problem(repo)
    os.chmod(os.path.join(repo, "HEAD"), 0o600)
    assert "is not readable by the sandbox's user (chmod -R a+rX" in tlb.git_mirror_problem(repo)


def test_a_clone_without_a_mirror_names_the_option(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("COMPACTRL_DOWNLOAD_CACHE", raising=False)
    task = load_task_dir(_clone_task(tmp_path), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable.startswith(
        "needs its image: RUN bash /app/setup.sh (git clone https://github.com/acme/widgets.git: not reachable here; "
        "a bare mirror of it at <download cache>/git/<host>/<owner>/<name>.git, given with `--download-cache DIR`")
    with pytest.raises(ValueError, match="TerminalBenchConfig.download_cache: .* is not a folder"):
        TerminalBenchConfig(download_cache=str(tmp_path / "absent"))


def test_validate_takes_the_download_cache(tmp_path, capsys, monkeypatch) -> None:
    from compactrl.cli import main

    monkeypatch.delenv("COMPACTRL_DOWNLOAD_CACHE", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["tasks", "validate", _clone_task(tmp_path), "--download-cache", str(tmp_path / "absent")])
    assert exc.value.code == 2
    assert f"--download-cache: '{tmp_path / 'absent'}' is not a folder" in capsys.readouterr().err


@pytest.mark.timeout(300)
@needs_local
def test_a_setup_script_clones_from_the_mirror(tmp_path, cache) -> None:
    mirror_cache, commit = _mirror(tmp_path)
    task = load_task_dir(_clone_task(tmp_path), TerminalBenchConfig(backend="local", prepare=True,
                                                                    download_cache=mirror_cache))
    assert not task.grading.not_gradable, task.grading.not_gradable
    build = task.build.plan
    assert build["git"]["https://github.com/acme/widgets.git"]["head"] == commit
    assert any(n.startswith("git clone https://github.com/acme/widgets.git: from the mirror ") for n in
               task.grading.local_notes)
    state = task.runtime.state
    with open(os.path.join(state, "work", "widgets", "README")) as fh:
        assert fh.read() == "widgets v1\n"
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"]


# ------------------------------------------------------------------------------------------- npm
def test_npm_steps_are_fetched_at_prepare_or_run_or_left_to_the_image() -> None:
    def action(text: str) -> str:
        return tlb.classify(text, {}, "").action

    assert action("npm ci") == "npm" and action("npm install --prefix /tmp/warm tsx@4.19.2") == "npm"
    assert action("npm i") == "npm" and action("CI=1 npm install") == "npm"
    assert action("npm run build") == "run" and action("npm test") == "run" and action("npm --version") == "run"
    assert action("npm install -g typescript") == "image" and action("npm publish") == "image"
    # a reference solution that installs from the registry needs the network in its episode
    assert tlb.solution_network("cd /app\nnpm install left-pad\n") == "npm install"
    plan, why = tlb.plan([{"op": "run", "command": "npm ci && npm run build", "workdir": "/app"}], {}, "", "/app", "k")
    assert why is None and plan.steps[0]["npm"] == [["npm", "ci"]] and plan.steps[0]["command"] == "npm ci && npm run build"
    assert plan.env["npm_config_cache"] == "/root/.npm"  # where the image's npm keeps it


@pytest.mark.timeout(300)
@needs_local
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_an_npm_ci_step_runs_offline_in_the_sandbox(tmp_path, cache) -> None:
    folder = tmp_path / "npm-task"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.yaml").write_text("instruction: run the app\nparser_name: pytest\n")
    (folder / "Dockerfile").write_text("FROM node:20-bookworm\nWORKDIR /app\nCOPY package.json package-lock.json ./\n"
                                       "RUN npm ci && npm run build\n")
    (folder / "package.json").write_text('{"name": "app", "version": "1.0.0", "scripts": {"build": '
                                         '"node -e \\"require(\'fs\').writeFileSync(\'built.txt\', \'ok\')\\""}}\n')
    (folder / "package-lock.json").write_text('{"name": "app", "version": "1.0.0", "lockfileVersion": 3, "requires": '
                                              'true, "packages": {"": {"name": "app", "version": "1.0.0"}}}\n')
    (folder / "solution.sh").write_text("cp built.txt out.txt\n")
    (folder / "tests" / "test_outputs.py").write_text("def test_out():\n    assert open('/app/out.txt').read() == 'ok'\n")
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert os.path.isfile(os.path.join(task.runtime.state, "work", "built.txt"))  # the step's script ran
    assert task.runtime.env["npm_config_cache"] == "/root/.npm"
    gold = run_task(task, GoldPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]


# ------------------------------------------------------------------------ /var/lib, moving /tests
@pytest.mark.timeout(300)
@needs_local
def test_a_dockerfile_step_writing_var_lib_is_replayed(cache) -> None:
    task = load_task_dir(os.path.join(LOCAL, "var-lib"), TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert "/var/lib" in task.runtime.writable_paths
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"]
    assert not os.path.exists("/var/lib/compactrl-bench")  # the host's /var/lib is untouched


@pytest.mark.timeout(300)
@needs_local
def test_tests_that_move_the_tests_folder_run_from_a_plain_folder(cache) -> None:
    task = load_task_dir(os.path.join(LOCAL, "moves-tests"), TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert task.origin["tests_moved"] == "tests/test_outputs.py"
    assert 'Path("/app/.tbench_tests")' in task.check.hidden_files[".tbench_run/rw/test_outputs.py"]
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"] and "1 failed" in noop["info"]["test_log_tail"]


# ------------------------------------------------------------------------------------ wheelhouse
def _wheel(folder) -> str:
    """``compactrl_fixture_pkg-1.0-py3-none-any.whl``: a module whose ``VALUE`` is 42."""
    path = os.path.join(str(folder), "compactrl_fixture_pkg-1.0-py3-none-any.whl")
    dist = "compactrl_fixture_pkg-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("compactrl_fixture_pkg/__init__.py", "VALUE = 42\n")
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: compactrl-fixture-pkg\nVersion: 1.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    return path


@pytest.mark.timeout(300)
@needs_local
def test_the_solutions_packages_are_in_a_wheelhouse_noop_does_not_see(tmp_path, cache, monkeypatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    # prepare's pip download finds the wheel offline (pip's own options, as a user's pip.conf could say)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    folder = write_tb_task(
        tmp_path / "pip-task", instruction="compute the value", dockerfile="FROM python:3.11-slim\nWORKDIR /app\n",
        solution="pip install compactrl-fixture-pkg==1.0\n"
                 "python -c 'import compactrl_fixture_pkg as p; print(p.VALUE)' > /app/v.txt\n",
        tests="def test_value():\n    assert open('/app/v.txt').read().strip() == '42'\n\n"
              "def test_the_package_is_importable():\n    import compactrl_fixture_pkg  # noqa: F401\n")
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable, task.grading.not_gradable
    build = task.build.plan
    assert build["wheelhouse"] == ["compactrl-fixture-pkg==1.0"] and not build["pip"]  # not pre-installed
    state = task.runtime.state
    assert os.listdir(os.path.join(state, "wheelhouse")) == ["compactrl_fixture_pkg-1.0-py3-none-any.whl"]
    assert not os.path.exists(os.path.join(state, "site", "compactrl_fixture_pkg"))
    assert task.runtime.env["PIP_NO_INDEX"] == "1" and task.runtime.env["UV_OFFLINE"] == "1"
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"]
    assert "No module named 'compactrl_fixture_pkg'" in noop["info"]["test_output"]


def _gen_task(tmp_path) -> str:
    """The official set's pattern: COPY a generator, RUN it, RUN rm it (the image's final state lacks it)."""
    folder = tmp_path / "generated"
    write_tb_task(folder, instruction="Print the key from keys.txt to answer.txt.",
                  dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY task-deps/* /app\nRUN python3 gen.py\n"
                             "RUN rm gen.py\n",
                  solution="cp /app/keys.txt /app/answer.txt\n",
                  tests="import os\n\ndef test_answer():\n    assert not os.path.exists('/app/gen.py')\n"
                        "    assert open('/app/answer.txt').read() == 'k-42\\n'\n")
    (folder / "task-deps").mkdir()
    (folder / "task-deps" / "gen.py").write_text("open('keys.txt', 'w').write('k-42\\n')\n")
    (folder / "task-deps" / "notes.txt").write_text("kept\n")
    return str(folder)


@pytest.mark.timeout(300)
@needs_local
def test_a_copied_file_a_later_step_removes_is_there_for_the_steps_between(tmp_path, cache) -> None:
    folder = _gen_task(tmp_path)
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert sorted(task.files) == ["notes.txt"]  # the image's final state: gen.py removed
    work = os.path.join(task.runtime.state, "work")
    assert os.path.isfile(os.path.join(work, "keys.txt")) and not os.path.exists(os.path.join(work, "gen.py"))
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"]


def test_a_copy_of_a_file_the_folder_lacks_is_named(tmp_path) -> None:
    folder = _gen_task(tmp_path)
    with open(os.path.join(folder, "Dockerfile"), "a") as fh:
        fh.write("COPY weights.pt /app/\n")
    task = load_task_dir(folder, TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable == ("the task's files are incomplete: COPY weights.pt names nothing in the "
                                             "build context (its image cannot be built from these files either)")
