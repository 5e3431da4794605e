"""Session files: bounded buffers, a torn last line survives, finishing is atomic and final."""

import pytest

from compactrl.gateway.recording import CallRecord, Recorder, SampledChoice, check_session, load_session


def _call(session: str, index: int) -> CallRecord:
    return CallRecord(session=session, index=index, agent="a", parent_agent=None, prompt_ids=[1, 2, index],
                      choices=[SampledChoice([5, 2], [-0.5, -0.25], True)], policy_version=3, model="m",
                      route="chat", t_received=0.0)


def test_buffers_spill_to_the_part_file_and_finish_renames_it(tmp_path):
    rec = Recorder(tmp_path, max_buffered=2, max_open_sessions=2)
    for _i in range(3):
        rec.record(_call("s1", rec.next_index("s1")))
    assert len(rec.part_path("s1").read_text().splitlines()) == 2  # two spilled, one buffered
    for name in ("s2", "s3"):  # a third open session pushes the least recent one to disk
        rec.record(_call(name, rec.next_index(name)))
    assert len(rec.part_path("s1").read_text().splitlines()) == 3
    with open(rec.part_path("s1"), "a") as f:
        f.write('{"type": "call", "session": "s1", "ind')  # a writer that crashed mid-line
    assert [c.index for c in load_session(rec.part_path("s1")).calls] == [0, 1, 2]
    path = rec.finish("s1", 1.0, {"why": "test"})
    assert path.name == "s1.jsonl" and not rec.part_path("s1").exists()
    session = load_session(path)
    assert session.finished and session.reward == 1.0 and session.info == {"why": "test"}
    assert session.calls[0].choices[0].log_probs == [-0.5, -0.25] and session.calls[0].policy_version == 3
    with pytest.raises(ValueError, match="finished"):
        rec.next_index("s1")
    with pytest.raises(ValueError, match="already finished"):
        rec.finish("s1", 0.0)


@pytest.mark.parametrize("name", ["../x", "", "a/b", ".hidden", "x" * 200])
def test_session_names_are_checked(name):
    with pytest.raises(ValueError, match="session"):
        check_session(name)
