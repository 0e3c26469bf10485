"""A seeded random fuzzer of the warm server's request decoder, run inside an airhost rank (where
the server's own `_airhost_rank` module is): runtime/warm.py loaded from its source.

    fuzz_warm_decoder.py WARM_PY RUNS SEED

Each input is a request body mutated from a valid one (bits flipped, bytes cut, inserted or
repeated, a length field set to a large or off-by-one value, two bodies spliced). The decoder
must return fields or raise MalformedRequest, nothing else; and every valid body decodes back
to what was encoded. Prints `fuzzed N inputs: A decoded, B refused`; an unexpected exception
is raised with the input that caused it (hex), the rank fails, and the test says so."""
import importlib.util
import random
import struct
import sys

path, runs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = importlib.util.spec_from_file_location("_warm_under_test", path)
warm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(warm)

rng = random.Random(seed)
SEEDS = [
    {},
    {"version": b"0", "env": b"A=1\0B=2\0PYTHONPATH=/x"},
    {"rank": b"3", "argv": b"train.py\0--lr\x000.1", "cwd": "/tmp/\u00e9t\u00e9".encode()},
    {"": b"", "x" * 300: bytes(range(256)) * 4},
    {"kind": b"\xff\xfe\x00", "n": b"1" * 1000},
]


def body_of(fields):
    return warm.encode(1, fields)[16:]


for fields in SEEDS:  # round trip
    got = warm.decode_fields(body_of(fields))
    assert got == {k: (v if isinstance(v, bytes) else str(v).encode()) for k, v in fields.items()}, (fields, got)


def mutate(b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and b:  # flip bits
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # cut
            del b[rng.randrange(len(b)):]
        elif op == 2:  # insert random bytes
            i = rng.randint(0, len(b))
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and len(b) >= 4:  # a 4-byte length: huge, zero, or one off
            i = rng.randrange(len(b) - 3)
            v = rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, struct.unpack_from("<I", b, i)[0] + rng.choice([-1, 1])])
            struct.pack_into("<I", b, i, v & 0xFFFFFFFF)
        elif op == 4 and len(b) >= 8:  # an 8-byte length
            i = rng.randrange(len(b) - 7)
            v = rng.choice([0, 1 << 63, (1 << 64) - 1, len(b), len(b) + 1])
            struct.pack_into("<Q", b, i, v)
        elif op == 5 and b:  # repeat a slice
            i = rng.randrange(len(b))
            j = rng.randint(i, min(len(b), i + 32))
            b[j:j] = b[i:j] * rng.randint(1, 8)
        else:  # splice with another seed
            other = body_of(rng.choice(SEEDS))
            i, j = rng.randint(0, len(b)), rng.randint(0, len(other))
            b = b[:i] + bytearray(other[j:])
    return bytes(b)


bodies = [body_of(f) for f in SEEDS]
decoded = refused = 0
for n in range(runs):
    data = mutate(rng.choice(bodies))
    try:
        fields = warm.decode_fields(data)
        for name in fields:
            try:
                warm.text_field(fields, name)
            except warm.MalformedRequest:
                pass
        decoded += 1
        if len(bodies) < 200 and rng.random() < 0.01:
            bodies.append(data)  # a decodable mutant breeds further ones
    except warm.MalformedRequest:
        refused += 1
    except Exception as e:  # noqa: BLE001 — what the fuzzer looks for
        raise AssertionError(f"input {n} ({data.hex()}) raised {type(e).__name__}: {e}") from e
print(f"fuzzed {runs} inputs: {decoded} decoded, {refused} refused", flush=True)
