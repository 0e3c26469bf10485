"""Ends its output with a line that has no newline, on stdout and on stderr."""
from emit import RANK, err, out, say

say(f"first line of rank {RANK}")
err(f"stderr without newline from rank {RANK}")
out(f"last words of rank {RANK} without a newline")
