"""Every rank writes many long, distinctive lines as fast as it can, each line in three
separate write() calls, so the host sees lines arrive in pieces from all ranks at once.

    flood.py LINES WIDTH

Line i of rank R: "R:iiiii:" + WIDTH copies of the rank's letter + ":R:iiiii:end"."""
import sys

from emit import RANK, out, wait_for_all

wait_for_all("start")  # start together, so the floods overlap

lines, width = int(sys.argv[1]), int(sys.argv[2])
letter = "abcdefghijklmnopqrstuvwxyz"[RANK % 26]
for i in range(lines):
    line = f"{RANK}:{i:05d}:" + letter * width + f":{RANK}:{i:05d}:end\n"
    out(line[:5])
    out(line[5:width // 2])
    out(line[width // 2:])
