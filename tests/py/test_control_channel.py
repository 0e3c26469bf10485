"""The control channel: results and errors travel over a private descriptor, not pipes of
bounded size, and the ranks see no port of it."""
import os
import pickle

import pytest


@pytest.mark.timeout(120)
def test_a_result_far_larger_than_a_pipe_buffer_comes_back_whole(airhost, work):
    (work / "big.py").write_text(
        "import os\n"
        "def main():\n"
        "    rank = int(os.environ['RANK'])\n"
        "    return bytes([rank]) * (48 << 20)\n"  # 48 MiB, ~750 pipe buffers
    )
    run = airhost(str(work / "big.py") + ":main", "-n", "2", cwd=work)
    run.assert_rc(0)
    for rank in range(2):
        value = pickle.loads((run.run_dir / "results" / f"rank-{rank}.pkl").read_bytes())
        assert value == bytes([rank]) * (48 << 20)
    assert all(r["has_result"] for r in run.ranks)


@pytest.mark.timeout(60)
def test_the_channel_is_an_inherited_descriptor_closed_to_programs_the_rank_starts(airhost, work):
    (work / "fd.py").write_text(
        "import os, socket, stat, subprocess, sys\n"
        "fd = int(os.environ['AIRHOST_CONTROL_FD'])\n"
        "st = os.fstat(fd)\n"
        "s = socket.socket(fileno=os.dup(fd))\n"
        "print('family', s.family.name, 'sock', stat.S_ISSOCK(st.st_mode), 'cloexec', not os.get_inheritable(fd))\n"
        "child = subprocess.run(['sh', '-c', 'readlink /proc/$$/fd/3 || echo none'], capture_output=True, text=True, close_fds=False)\n"
        "print('child fd 3:', child.stdout.strip())\n"
    )
    run = airhost(str(work / "fd.py"), "-n", "1", cwd=work)
    run.assert_rc(0)
    out = run.log(0).decode()
    assert "family AF_UNIX sock True cloexec True" in out
    assert "child fd 3: none" in out, out  # an exec'd program never holds the channel
