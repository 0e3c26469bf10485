"""Log probe: the rank writes numbered lines to stdout as fast as it can for
$AIRHOST_BENCH_LOG_SECONDS seconds (default 5).

Line i of rank R is "R iiiiiiiiii " followed by 60 x's (83 bytes with the newline), so the
benchmark can tell a lost line (a gap in i), a duplicate, and a torn or mixed line (anything
else). Lines go out in blocks of 96 (about 8 KB, what Python's own buffered stdout writes
at a time) through os.write on fd 1, identically under every launcher, so any difference
in what arrives is the launcher's. A block may be written partly: the rest follows, as a
buffered file would do. The record says how many lines the rank wrote."""
import os
import time

from _stamp import rank, stamp

R = rank()
PAD = "x" * 60
BLOCK = 96

t0 = time.time()
deadline = t0 + float(os.environ.get("AIRHOST_BENCH_LOG_SECONDS", "5"))
seq = 0
write = os.write
while True:
    block = "".join([f"{R} {i:010d} {PAD}\n" for i in range(seq, seq + BLOCK)]).encode()
    view = memoryview(block)
    while view:
        view = view[write(1, view):]
    seq += BLOCK
    if time.time() >= deadline:
        break
stamp("log", R, t_start=t0, t_end=time.time(), lines=seq)
