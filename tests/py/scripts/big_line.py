"""Rank 0 writes one 10,000,000-byte line without a newline: "000000000|000000001|..."."""
from emit import out

data = "".join(f"{i:09d}|" for i in range(1_000_000)).encode()
assert len(data) == 10_000_000
out(data)
