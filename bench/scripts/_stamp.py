"""The one helper every rank-side script of the benchmark shares: stamp() writes a small JSON
record (a time stamp and whatever else the script measured, plus the process's pid and
start time) to $AIRHOST_BENCH_STAMPS/<kind>.<rank>. The benchmark counts a rank as
accounted for by its record, and after the launcher exits it checks by (pid, start time)
that no rank process is still alive, which works even for ranks that do not inherit the
launcher's environment (a warm server's forks).

The scripts import it from their own directory, which is sys.path[0] under every launcher
(airhost, torchrun, accelerate, python), and under mp.spawn in the children too."""
import json
import os

STAMP_ENV = "AIRHOST_BENCH_STAMPS"


def start_time(pid="self") -> int:
    """Field 22 of /proc/<pid>/stat: clock ticks after boot at which the process started."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def stamp(kind: str, rank, **fields) -> None:
    fields.update(pid=os.getpid(), start=start_time())
    path = os.path.join(os.environ[STAMP_ENV], f"{kind}.{rank}")
    with open(path + ".tmp", "w") as f:
        json.dump(fields, f)
    os.replace(path + ".tmp", path)  # the benchmark never reads half a record


def rank() -> int:
    return int(os.environ.get("RANK", "0"))
