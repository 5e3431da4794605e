"""Required tests that reach a host other than this machine are found in their source, and the row is
flagged before any episode (the sandbox has no network: such a test would fail for a reason the row
does not name)."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.tasksets.swebench.network import function_of, network_reason, network_tests, remote_host
from compactrl.tasksets.swebench.rows import SWEBenchConfig, row_to_task

pytestmark = pytest.mark.timeout(60)

# requests 0.14's suite (psf__requests-863): the service URL set through the environment, a helper that
# builds URLs from it, a tuple of helpers iterated in the tests
REQUESTS_014 = '''
import os, unittest
import requests
from requests import get, post

if 'HTTPBIN_URL' not in os.environ:
    os.environ['HTTPBIN_URL'] = 'http://httpbin.org/'
HTTPBIN_URL = os.environ.get('HTTPBIN_URL')

def httpbin(*suffix):
    return HTTPBIN_URL + '/'.join(suffix)

SERVICES = (httpbin, )

class RequestsTestSuite(unittest.TestCase):
    def test_GET_no_redirect(self):
        for service in SERVICES:
            r = get(service('redirect', '3'), allow_redirects=False)
            self.assertEqual(r.status_code, 302)

    def test_prepared_send(self):
        req = requests.Request('GET', httpbin('get'))
        prep = req.prepare()
        requests.Session().send(prep)

    def test_helper(self):
        self._fetch()

    def _fetch(self):
        return post(httpbin('post'), data={})

    def test_offline(self):
        headers = {'Location': 'http://httpbin.org/'}
        assert headers.get('Location')
        assert requests.Request('GET', 'http://example.com').url

    def test_loopback(self):
        get('http://127.0.0.1:8080/get')
'''

# requests 2.10+: pytest-httpbin's fixture, a local server on loopback, shadows any module-level name
FIXTURE = '''
import requests
HTTPBIN = 'http://httpbin.org/'

def httpbin(*suffix):
    return HTTPBIN + '/'.join(suffix)

def test_local_server(httpbin):
    requests.get(httpbin('get'))
'''


def ids(names):
    return [f"tests/test_requests.py::RequestsTestSuite::{n}" for n in names]


def test_tests_that_fetch_a_remote_host_are_found_with_the_host() -> None:
    files = {"tests/test_requests.py": REQUESTS_014}
    hits = network_tests(files, ids(["test_GET_no_redirect", "test_prepared_send", "test_helper", "test_offline",
                                     "test_loopback"]))
    assert [(t.rsplit("::", 1)[1], host) for t, _, host in hits] == [
        ("test_GET_no_redirect", "httpbin.org"), ("test_prepared_send", "httpbin.org"), ("test_helper", "httpbin.org")]
    why = network_reason(files, ids(["test_offline", "test_helper", "test_GET_no_redirect"]))
    assert why.startswith("needs network at test time: tests/test_requests.py::RequestsTestSuite::test_helper "
                          "(and 1 more required test) reaches httpbin.org (read from tests/test_requests.py)")


def test_a_fixture_parameter_shadows_the_module_name_it_spells() -> None:
    assert network_reason({"tests/test_x.py": FIXTURE}, ["tests/test_x.py::test_local_server"]) is None


def test_a_file_that_does_not_parse_is_read_as_one_statement() -> None:
    py2 = "import urllib2\nURL = 'http://httpbin.org/get'\ndef test_x():\n    print 'x'\n    urllib2.urlopen(URL)\n"
    assert network_tests({"t.py": py2}, ["t.py::test_x", "t.py::test_y"]) == [("t.py::test_x", "t.py", "httpbin.org")]


@settings(max_examples=60, deadline=None)
@given(host=st.sampled_from(["localhost", "127.0.0.1", "127.3.2.1", "0.0.0.0", "[::1]"]),
       port=st.integers(1, 65535), path=st.text("abc/", max_size=8))
def test_loopback_is_never_remote(host, port, path) -> None:
    url = f"http://{host}:{port}/{path}"
    assert remote_host(url) is None
    source = f"import requests\nURL = {url!r}\ndef test_x():\n    requests.get(URL)\n"
    assert network_reason({"t.py": source}, ["t.py::test_x"]) is None


@settings(max_examples=60, deadline=None)
@given(name=st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True),
       tld=st.sampled_from(["org", "com", "io", "net"]))
def test_any_remote_host_a_test_fetches_is_named(name, tld) -> None:
    host = f"{name}.{tld}"
    source = f"import urllib.request\ndef test_x():\n    urllib.request.urlopen('https://{host}/data')\n"
    assert network_tests({"t.py": source}, ["t.py::test_x"]) == [("t.py::test_x", "t.py", host)]


def test_test_ids_of_every_runner_name_their_function() -> None:
    assert function_of("a/test_b.py::TestC::test_d[http://x-ConnectionError]") == "test_d"
    assert function_of("test_d (app.tests.TestC)") == "test_d"
    assert function_of("test_d") == "test_d"


def _git(cwd, *args) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_a_row_whose_required_tests_fetch_is_flagged_before_any_episode(tmp_path) -> None:
    repo = tmp_path / "repos" / "psf__requests"
    (repo / "tests").mkdir(parents=True)
    (repo / "requests.py").write_text("def get(url, **kw):\n    raise OSError(url)\n")
    (repo / "tests" / "test_requests.py").write_text("import requests\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "tests" / "test_requests.py").write_text(REQUESTS_014)
    test_patch = _git(repo, "diff") + "\n"
    _git(repo, "checkout", "-q", "--", ".")
    (repo / "requests.py").write_text("def get(url, **kw):\n    return url\n")
    patch = _git(repo, "diff") + "\n"
    _git(repo, "checkout", "-q", "--", ".")
    row = {"instance_id": "psf__requests-1", "repo": "psf/requests", "base_commit": base, "patch": patch,
           "test_patch": test_patch, "FAIL_TO_PASS": json.dumps(ids(["test_offline"])),
           "PASS_TO_PASS": json.dumps(ids(["test_GET_no_redirect"]))}
    task = row_to_task(row, SWEBenchConfig(repos_root=str(tmp_path / "repos")))
    assert task.grading.not_gradable.startswith(
        "needs network at test time: tests/test_requests.py::RequestsTestSuite::test_GET_no_redirect reaches httpbin.org")
    row["PASS_TO_PASS"] = json.dumps(ids(["test_loopback"]))
    assert not row_to_task(row, SWEBenchConfig(repos_root=str(tmp_path / "repos"))).grading.not_gradable
