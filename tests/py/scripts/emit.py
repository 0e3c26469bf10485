"""Output helpers for the test scripts: every byte a rank writes through out()/err() goes
to its stdout/stderr (file descriptors 1 and 2, unbuffered) and is also appended to
<cwd>/printed/rank-<RANK>.stdout|stderr, so a test can compare the host's log files with
exactly what the rank printed, whatever happens to the rank afterwards."""
import os

RANK = int(os.environ.get("RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
_DIR = os.path.join(os.getcwd(), "printed")
_records = {}


def _record(stream):
    f = _records.get(stream)
    if f is None:
        os.makedirs(_DIR, exist_ok=True)
        f = _records[stream] = open(os.path.join(_DIR, f"rank-{RANK}.{stream}"), "ab", buffering=0)
    return f


def _write(fd, stream, data):
    if isinstance(data, str):
        data = data.encode()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    _record(stream).write(data)


def out(data):
    """Writes str or bytes to stdout, as they are."""
    _write(1, "stdout", data)


def err(data):
    """Writes str or bytes to stderr, as they are."""
    _write(2, "stderr", data)


def say(text):
    """One line on stdout."""
    out(text + "\n")


def warn(text):
    """One line on stderr."""
    err(text + "\n")


def wait_for_all(name, timeout=30.0):
    """A barrier through files in <cwd>/barrier-<name>/: returns once every rank of the run
    has called it (or after `timeout`), so a test's timing does not depend on how fast each
    rank's interpreter started."""
    import time

    directory = os.path.join(os.getcwd(), f"barrier-{name}")
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, str(RANK)), "w").close()
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < WORLD_SIZE and time.monotonic() < deadline:
        time.sleep(0.005)
