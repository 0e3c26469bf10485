"""What a rank shows is what plain python gives (issue 17, output): a `\\r` progress bar
reaches the caller's terminal as it moves, not when it ends; a partial line (a prompt) shows
before its newline and goes on without a second prefix; two ranks never share a console
line; the logs keep every byte as written; a rank is told the caller's terminal width.

Timings are loose on purpose (the CI machine has two slow cores): a bar of 3 s must arrive
in several reads spread over more than a second, and a prompt must show a second or more
before its end arrives."""
import errno
import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
import time

import pytest

from conftest import script

pytestmark = pytest.mark.timeout(120)

LIVE = script("live.py")
STEPS, SECONDS = 15, 3


def console_of(data: bytes, prefix: bytes) -> bytes:
    """What the console shows of one rank's stream when no other rank writes in between:
    its prefix at each line start and again after each `\\r` redraw (a `\\r` not part of
    `\\r\\n`; at a line start the prefix alone), and a last line ended."""
    shown = bytearray()
    line_open = False
    for i in range(len(data)):
        c = data[i:i + 1]
        redraw = c == b"\r" and data[i + 1:i + 2] not in (b"\n", b"")
        if redraw:
            shown += (b"\r" + prefix) if line_open else prefix
        else:
            if not line_open:
                shown += prefix
            shown += c
        line_open = c != b"\n"
    if line_open:
        shown += b"\n"
    return bytes(shown)


def reads_with(pieces, pattern: bytes):
    """The arrival times of the reads that carry `pattern`, and how many each carried."""
    return [(t, data.count(pattern)) for t, data in pieces if pattern in data]


def assert_arrived_as_it_moved(reads, redraws: int, what: str):
    """The redraws of a bar of SECONDS came in several reads spread over its run, not in one
    lump at its end."""
    assert len(reads) >= 5, f"{what}: {redraws} redraws came in only {len(reads)} reads: {reads}"
    assert max(n for _, n in reads) <= redraws // 2, f"{what}: most redraws came in one read: {reads}"
    spread = reads[-1][0] - reads[0][0]
    assert spread >= SECONDS / 2, f"{what}: the redraws came within {spread:.2f} s of each other: {reads}"


def test_a_bar_reaches_the_console_as_it_moves_and_the_log_keeps_its_bytes(airhost):
    run, pieces = airhost.timed(LIVE, "-n", "1", "--", "bar", STEPS, SECONDS)
    run.assert_rc(0)
    assert_arrived_as_it_moved(reads_with(pieces["stderr"], b"step"), STEPS + 1, "plain bar")
    written = "".join(f"\rrank 0 step {i:02d}/{STEPS}" for i in range(STEPS + 1)).encode() + b"\n"
    assert run.log(0, "stderr") == written == run.printed(0, "stderr")
    # Each redraw is drawn under the rank's name: the terminal shows "[rank 0] rank 0 step 07/15".
    assert run.stderr.startswith(console_of(written, b"[rank 0] ")), run.describe()
    assert run.stderr.startswith(b"[rank 0] rank 0 step 00/15\r[rank 0] rank 0 step 01/15\r")


def test_a_tqdm_bar_reaches_the_console_as_it_moves(airhost):
    pytest.importorskip("tqdm")
    run, pieces = airhost.timed(LIVE, "-n", "1", "--", "tqdm", STEPS, SECONDS)
    run.assert_rc(0)
    assert_arrived_as_it_moved(reads_with(pieces["stderr"], b"rank0:"), STEPS + 1, "tqdm")
    log = run.log(0, "stderr")
    assert log == run.printed(0, "stderr")
    assert log.count(b"\r") > STEPS and log.endswith(b"\n")
    ours = run.stderr[:run.stderr.index(b"airhost: run ")] if b"airhost: run " in run.stderr else run.stderr
    assert ours == console_of(log, b"[rank 0] "), run.describe()


def test_two_ranks_bars_never_share_a_console_line(airhost):
    run, pieces = airhost.timed(LIVE, "-n", "2", "--", "bar", STEPS, SECONDS)
    run.assert_rc(0)
    steps_seen = {0: [], 1: []}
    lines = run.stderr.split(b"\n")
    for line in lines:
        if not line or line.startswith(b"airhost: "):
            continue
        segments = line.split(b"\r")
        ranks = set()
        for segment in segments:
            m = re.fullmatch(rb"\[rank ([01])\] rank ([01]) step (\d\d)/15", segment)
            assert m and m.group(1) == m.group(2), f"a torn or unnamed redraw {segment!r} in line {line!r}"
            ranks.add(int(m.group(1)))
            steps_seen[int(m.group(1))].append(int(m.group(3)))
        assert len(ranks) == 1, f"two ranks in one console line: {line!r}"
    for rank in (0, 1):
        assert steps_seen[rank] == list(range(STEPS + 1)), f"rank {rank}'s redraws lost or out of order"
        assert_arrived_as_it_moved(reads_with(pieces["stderr"], f"rank {rank} step".encode()), STEPS + 1,
                                   f"rank {rank}")
        written = "".join(f"\rrank {rank} step {i:02d}/{STEPS}" for i in range(STEPS + 1)).encode() + b"\n"
        assert run.log(rank, "stderr") == written == run.printed(rank, "stderr")


def test_a_partial_line_shows_before_its_end_and_another_ranks_line_never_lands_inside_it(airhost):
    run, pieces = airhost.timed(LIVE, "-n", "2", "--", "prompt")
    run.assert_rc(0)
    # Rank 1's line came while rank 0's prompt was open: the prompt's line is ended first and
    # its rest is named again, so each console line is one rank's.
    assert run.stdout == b"[rank 0] Password: \n[rank 1] hello from rank 1\n[rank 0] ok\n", run.describe()
    shown_at = next(t for t, data in pieces["stdout"] if b"Password: " in data)
    ended_at = next(t for t, data in pieces["stdout"] if b"ok\n" in data)
    assert ended_at - shown_at >= 1.0, f"the prompt showed at {shown_at:.2f} s, only with its end at {ended_at:.2f} s"
    assert run.log(0) == b"Password: ok\n" == run.printed(0)
    assert run.log(1) == b"hello from rank 1\n" == run.printed(1)


def test_a_partial_line_continues_without_a_second_prefix_and_hidden_ranks_stay_out(airhost):
    run, pieces = airhost.timed("--ranks", "0", LIVE, "-n", "2", "--", "prompt")
    run.assert_rc(0)
    assert run.stdout == b"[rank 0] Password: ok\n", run.describe()
    shown_at = next(t for t, data in pieces["stdout"] if b"Password: " in data)
    ended_at = next(t for t, data in pieces["stdout"] if b"ok\n" in data)
    assert ended_at - shown_at >= 1.0
    assert run.log(1) == b"hello from rank 1\n"


def run_in_terminal(airhost, columns: int, lines: int, *args, timeout: float = 90.0) -> bytes:
    """Runs airhost with a terminal of that size as its stdout and stderr; returns what the
    terminal got (its line discipline turns each "\\n" into "\\r\\n")."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    runs_root = airhost._new_runs_root()
    env = airhost.env(runs_root, unset=("COLUMNS", "LINES", "TQDM_NCOLS"))
    proc = subprocess.Popen([airhost.binary, *map(str, args)], cwd=airhost.work, env=env, stdout=slave,
                            stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    got = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 1 << 16)
            except OSError as e:  # EIO: every writer closed the terminal
                assert e.errno == errno.EIO, e
                break
            if not data:
                break
            got += data
        assert proc.wait(timeout=max(1, deadline - time.monotonic())) == 0, bytes(got)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return bytes(got)


def test_ranks_are_told_the_callers_terminal_width_less_their_prefix(airhost):
    pytest.importorskip("tqdm")
    shown = run_in_terminal(airhost, 100, 30, LIVE, "-n", "2", "--", "size")
    sizes = dict(re.findall(rb"\[rank (\d)\] size (.*?)\r\n", shown))
    assert set(sizes) == {b"0", b"1"}, shown
    for line in sizes.values():
        columns, lines, tqdm_ncols, shutil_columns, drawn, _, isatty = line.split()
        # "[rank 1] " takes 9 of the 100 columns; tqdm keeps one free, as on a terminal.
        assert (columns, lines, tqdm_ncols, shutil_columns) == (b"91", b"30", b"90", b"91"), line
        assert 80 <= int(drawn) <= 90, f"a tqdm bar {int(drawn)} wide in 91 columns: {line!r}"
        assert isatty == b"False"  # a pipe, so that the host sees (and logs) every byte


def test_without_a_terminal_ranks_are_told_no_width(airhost):
    run = airhost(LIVE, "-n", "1", "--", "size", unset_env=("COLUMNS", "LINES", "TQDM_NCOLS"))
    run.assert_rc(0)
    columns, lines, tqdm_ncols, _, _, _, isatty = run.stdout.split(b"size ")[1].split()
    assert (columns, lines, tqdm_ncols, isatty) == (b"None", b"None", b"None", b"False"), run.stdout
