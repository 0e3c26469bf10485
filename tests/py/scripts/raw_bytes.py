"""Writes bytes that are not UTF-8 (and a NUL) to stdout and stderr."""
from emit import err, out

out(b"\xff\xfe bad \x00 nul\n")
err(b"\xc3\x28 invalid \x80 continuation\n")
out(b"latin-1 caf\xe9\n")
