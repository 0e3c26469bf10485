"""No line is lost or torn at full output speed (issue 9, part 4).

Four ranks write numbered lines as fast as they can for about 3 s, on stdout and stderr in
turns, in blocks cut into 1 to 3 write() calls at arbitrary byte offsets (so the host sees
lines arrive in pieces, from every rank at once), with a line of 100 KB or more now and
then, and some ranks ending a stream without a newline. Every line a rank wrote must reach
the console exactly once, whole, with its rank's prefix, on the right stream, in the order
the rank wrote it; and each rank's log files must hold exactly the bytes it wrote."""
import inspect
import json
import re

import pytest

from conftest import split_lines

pytestmark = pytest.mark.timeout(120)

RANKS = 4
SECONDS = 3.0


def expected_line(rank: int, stream: str, seq: int) -> bytes:
    """Line `seq` of `rank` on `stream` ("o" or "e"), without its newline: distinctive
    content with the rank, stream and number at both ends, so a torn or mixed line can never
    pass for another; one line in 997 is 100 KB or more."""
    letter = "abcdefghij"[rank] if stream == "o" else "ABCDEFGHIJ"[rank]
    width = 100_000 + seq % 7919 if seq % 997 == 500 else seq % 61
    return f"{rank} {stream} {seq} {letter * width}|{rank}{stream}{seq}".encode()


# The rank's program; expected_line's source is put in front of it, so the ranks write
# exactly what the test expects.
RANK_MAIN = r'''
import json
import os
import random
import sys
import time

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
FD = {"o": 1, "e": 2}
rng = random.Random(RANK)
counts = {"o": 0, "e": 0}


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_in_pieces(fd, data):
    cuts = sorted(rng.randrange(1, len(data)) for _ in range(rng.randrange(0, 3)))
    for a, b in zip([0] + cuts, cuts + [len(data)]):
        if b > a:
            write_all(fd, data[a:b])


# Start together, so the floods overlap.
barrier = os.path.join(os.getcwd(), "barrier")
os.makedirs(barrier, exist_ok=True)
open(os.path.join(barrier, str(RANK)), "w").close()
deadline = time.monotonic() + 30
while len(os.listdir(barrier)) < WORLD and time.monotonic() < deadline:
    time.sleep(0.005)

end = time.monotonic() + float(sys.argv[1])
block = 0
while time.monotonic() < end:
    stream = "e" if (block * 7 + RANK) % 3 == 0 else "o"
    n = rng.randrange(1, 50)
    first = counts[stream]
    data = b"".join(expected_line(RANK, stream, s) + b"\n" for s in range(first, first + n))
    write_in_pieces(FD[stream], data)
    counts[stream] += n
    block += 1

# Last line of each stream: without a newline on stdout for ranks 1 and 3, on stderr for
# ranks 2 and 3.
newline = {"o": RANK not in (1, 3), "e": RANK not in (2, 3)}
for stream in ("o", "e"):
    write_in_pieces(FD[stream], expected_line(RANK, stream, counts[stream]) + (b"\n" if newline[stream] else b""))
    counts[stream] += 1
with open(os.path.join(os.getcwd(), f"counts-{RANK}.json"), "w") as f:
    json.dump({"counts": counts, "newline": newline}, f)
'''


def test_every_line_arrives_once_whole_and_in_order_at_full_speed(airhost, work):
    program = work / "stress.py"
    program.write_text(inspect.getsource(expected_line) + RANK_MAIN)
    run = airhost(program, "-n", RANKS, "--", SECONDS, timeout=90)
    run.assert_rc(0)

    # Nothing but rank lines on stdout; on stderr, besides them, only airhost's own closing line.
    assert all(re.match(rb"^\[rank \d\] ", line) for line in split_lines(run.stdout))
    own = [line for line in split_lines(run.stderr) if not re.match(rb"^\[rank \d\] ", line)]
    assert all(line.startswith(b"airhost: ") for line in own), own[:3]

    console = {"o": run.console("stdout"), "e": run.console("stderr")}
    long_lines = 0
    for rank in range(RANKS):
        record = json.loads((work / f"counts-{rank}.json").read_text())
        for stream, name in (("o", "stdout"), ("e", "stderr")):
            count = record["counts"][stream]
            assert count > 200, f"rank {rank} wrote only {count} lines on {name}: no stress"
            want = [expected_line(rank, stream, seq) for seq in range(count)]
            long_lines += sum(len(line) >= 100_000 for line in want)
            got = console[stream].get(rank, [])
            if got != want:
                pytest.fail(f"console {name} of rank {rank}: {describe_difference(got, want)}")
            log = run.log(rank, name)
            expected_log = b"\n".join(want) + (b"\n" if record["newline"][stream] else b"")
            if log != expected_log:
                pytest.fail(f"log {name} of rank {rank}: "
                            f"{describe_difference(split_lines(log), want)} "
                            f"({len(log)} bytes, {len(expected_log)} expected)")
    assert long_lines >= RANKS, f"only {long_lines} lines of 100 KB+ were written"
    run.assert_no_process_left()


def describe_difference(got: list, want: list) -> str:
    """Says where two lists of lines first differ (lines shortened)."""
    def short(line):
        return repr(line[:50]) + (f"...({len(line)} bytes)" if len(line) > 50 else "")

    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"line {i} is {short(g)}, expected {short(w)} ({len(got)} lines, {len(want)} expected)"
    return f"{len(got)} lines, {len(want)} expected (the shorter is a prefix of the longer)"
