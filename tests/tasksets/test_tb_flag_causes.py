"""A task flagged before any episode names the first cause, not only the step that holds it: the URL a
fetcher downloads, the hub dataset a build script loads, the download a failed step reached for."""

from __future__ import annotations

import pytest

import compactrl.tasksets.terminal_bench.local_build as tlb

pytestmark = pytest.mark.timeout(60)

HUB_SCRIPT = 'from datasets import load_dataset\n\nNAME = "allenai/c4"\nds = load_dataset(NAME, "en", split="train")\n'


def _why(steps: list[dict], context: str = "") -> str:
    plan, why = tlb.plan(steps, {}, context, "/app", "k")
    assert plan is None and why
    return why


def test_a_fetcher_flag_names_the_url_not_its_options() -> None:
    url = "https://huggingface.co/datasets/Yelp/yelp_review_full/resolve/main/test.parquet"
    why = _why([{"op": "run", "command": f"mkdir -p /app/data && wget -P /app/data {url}", "workdir": "/app"}])
    assert why.endswith(f"(wget {url})")


@pytest.mark.parametrize("step", ["python setup.py", "python3 /app/setup.py --split train", "bash /app/fetch.sh"])
def test_a_build_script_that_downloads_from_the_hub_is_named_as_the_cause(tmp_path, step: str) -> None:
    (tmp_path / "setup.py").write_text(HUB_SCRIPT)
    (tmp_path / "fetch.sh").write_text("set -e\nmkdir -p /data\npython3 setup.py\n")
    why = _why([{"op": "run", "command": f"pip install datasets && {step}", "workdir": "/app"}], str(tmp_path))
    assert "setup.py downloads from the Hugging Face hub: load_dataset('allenai/c4')" in why


def test_a_script_that_fetches_a_url_is_named_and_loopback_is_not_a_download(tmp_path) -> None:
    (tmp_path / "get.py").write_text('import urllib.request\nurllib.request.urlopen("http://127.0.0.1:8000/")\n'
                                     'urllib.request.urlretrieve("https://example.com/data.tgz", "d.tgz")\n')
    why = _why([{"op": "run", "command": "python3 get.py", "workdir": "/app"}], str(tmp_path))
    assert why.endswith("(get.py downloads https://example.com/data.tgz (urlretrieve))")
    (tmp_path / "get.py").write_text('import urllib.request\nurllib.request.urlopen("http://localhost:8000/")\n')
    assert tlb.script_download((tmp_path / "get.py").read_text()) is None


@pytest.mark.parametrize(("output", "cause"), [
    ("Downloading...\ncurl: (6) Could not resolve host: example.com\nmake: *** [all] Error 6\n",
     "curl: (6) Could not resolve host: example.com"),
    ("Traceback (most recent call last):\nhuggingface_hub.errors.LocalEntryNotFoundError: An error happened while "
     "trying to locate the file on the Hub\nexit\n",
     "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub"),
    ("fatal: unable to access 'https://github.com/o/n.git/': Could not resolve host: github.com\n",
     "fatal: unable to access 'https://github.com/o/n.git/': Could not resolve host: github.com"),
])
def test_a_failed_step_that_reached_for_the_network_names_that_line(output: str, cause: str) -> None:
    assert tlb.network_failure(output) == cause


def test_a_failure_of_another_kind_is_not_called_a_download() -> None:
    assert tlb.network_failure("gcc: error: foo.c: No such file or directory\n") is None
