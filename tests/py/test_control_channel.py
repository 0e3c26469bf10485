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


@pytest.mark.timeout(60)
def test_a_process_forked_from_a_rank_cannot_send_frames_or_descriptors(airhost, work):
    # A fork shares the channel's descriptor; frames from it would interleave with the rank's.
    # Every way of sending refuses in the child, and the rank's own result still arrives.
    (work / "forks.py").write_text(
        "import os\n"
        "def main():\n"
        "    import _airhost_rank\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        out = []\n"
        "        r, w = os.pipe()\n"
        "        for name, call in (('send_result', lambda: _airhost_rank.send_result(b'child')),\n"
        "                           ('send_result_fd', lambda: _airhost_rank.send_result_fd(r, 1, 'shm')),\n"
        "                           ('send_frame', lambda: _airhost_rank.send_frame(2, b'child'))):\n"
        "            try:\n"
        "                call()\n"
        "                out.append(name + ': sent')\n"
        "            except RuntimeError as e:\n"
        "                out.append(name + ': ' + str(e))\n"
        "        out.append('connected: ' + str(_airhost_rank.connected()))\n"
        "        with open('child.txt', 'w') as f:\n"
        "            f.write('\\n'.join(out))\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "    return 'parent'\n"
    )
    run = airhost(str(work / "forks.py") + ":main", "-n", "1", cwd=work)
    run.assert_rc(0)
    lines = (work / "child.txt").read_text().splitlines()
    refused = "this process was forked from an airhost rank; only the rank itself talks to the host"
    assert lines == [f"send_result: {refused}", f"send_result_fd: {refused}", f"send_frame: {refused}",
                     "connected: False"], lines
    assert pickle.loads((run.run_dir / "results" / "rank-0.pkl").read_bytes()) == "parent"
