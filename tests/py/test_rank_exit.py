"""How a function rank ends once it has returned: what Python's exit does that a program can
see (non-daemon threads joined, atexit callbacks, stdout/stderr and C stdio flushed), then
_exit, without tearing every module down (torch's teardown alone takes a second or more per
rank, and the caller waits for the slowest rank's exit to get its results).
AIRHOST_RANK_FINALIZE=1 keeps the full interpreter finalization."""
from __future__ import annotations

import pickle

import pytest

SCRIPT = (
    "import atexit, ctypes, os, sys, threading, time\n"
    "class Noisy:\n"
    "    def __del__(self):\n"
    "        print('module teardown ran', flush=True)\n"
    "KEPT = Noisy()\n"
    "def main():\n"
    "    atexit.register(lambda: print('atexit ran'))\n"
    "    def late():\n"
    "        time.sleep(0.3)\n"
    "        print('thread finished')\n"
    "    threading.Thread(target=late).start()\n"
    "    libc = ctypes.CDLL(None)\n"
    "    libc.printf(b'c stdio line\\n')\n"  # fully buffered: stdout is a pipe
    "    sys.stdout.write('no newline at the end')\n"
    "    if os.environ.get('HOW') == 'raise':\n"
    "        raise ValueError('boom')\n"
    "    if os.environ.get('HOW') == 'exit':\n"
    "        raise SystemExit(3)\n"
    "    return 42\n"
)


@pytest.mark.timeout(120)
def test_a_function_rank_ends_with_what_python_exit_does_that_a_program_sees(airhost, work):
    (work / "fn.py").write_text(SCRIPT)
    run = airhost(str(work / "fn.py") + ":main", "-n", "1", cwd=work)
    run.assert_rc(0)
    out = run.log(0).decode()
    for line in ("atexit ran", "thread finished", "c stdio line", "no newline at the end"):
        assert line in out, out
    assert "module teardown ran" not in out  # skipped: that is the point
    assert pickle.loads((run.run_dir / "results" / "rank-0.pkl").read_bytes()) == 42


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how, code", [("raise", 1), ("exit", 3)])
def test_a_function_rank_keeps_its_exit_code_when_it_raises_or_exits(airhost, work, how, code):
    (work / "fn.py").write_text(SCRIPT)
    run = airhost(str(work / "fn.py") + ":main", "-n", "1", cwd=work, env={"HOW": how})
    run.assert_rc(code)
    out = run.log(0).decode()
    assert "atexit ran" in out and "thread finished" in out and "c stdio line" in out


@pytest.mark.timeout(120)
def test_airhost_rank_finalize_1_keeps_the_full_interpreter_finalization(airhost, work):
    (work / "fn.py").write_text(SCRIPT)
    run = airhost(str(work / "fn.py") + ":main", "-n", "1", cwd=work, env={"AIRHOST_RANK_FINALIZE": "1"})
    run.assert_rc(0)
    out = run.log(0).decode()
    assert "module teardown ran" in out and "atexit ran" in out and "thread finished" in out
