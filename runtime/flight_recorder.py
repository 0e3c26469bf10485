"""What torch's flight recorder says of a run, in a few lines: which collective each rank
reached and which rank is missing from it (host/launch/watch/flight_recorder.hpp runs this).

    python -c SOURCE DIR [PREFIX]

DIR holds one dump per rank, PREFIX + global rank (default `nccl-trace-rank-`), as torch
writes them on an NCCL timeout (TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE) or as
`torch._C._distributed_c10d._dump_fr_trace()` returns them: a pickled (or JSON) dict with
`pg_status` (per process group: the last collective each rank enqueued, started and
completed) and `entries` (the ring: each collective's `pg_id`, `collective_seq_id` and
`profiling_name`). Only the standard library: it runs with any Python, torch or not, and
does what torch's own analyzer (fr_trace) does where that one stops (torch 2.13 cannot read
a gloo dump). Prints the summary on stdout; exits 0, or 1 when no dump could be read.
"""
import json
import os
import pickle
import sys


def ranges(ranks):
    ranks = sorted(set(ranks))
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def who(ranks):
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + ranges(ranks)


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data.lstrip()[:1] == b"{":
        return json.loads(data)
    return pickle.loads(data)


def as_int(v, default=-1):
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def main(argv):
    folder = argv[1]
    prefix = argv[2] if len(argv) > 2 else "nccl-trace-rank-"
    dumps, unreadable = {}, {}
    for name in sorted(os.listdir(folder)):
        if not name.startswith(prefix) or not name[len(prefix):].isdigit():
            continue
        rank = int(name[len(prefix):])
        try:
            dumps[rank] = load(os.path.join(folder, name))
        except Exception as e:  # a dump cut short (the rank died writing it), another format
            unreadable[rank] = f"{type(e).__name__}: {e}"
    if not dumps:
        print(f"no flight recorder dump could be read in {folder}" +
              (f" ({len(unreadable)} unreadable)" if unreadable else ""))
        return 1

    lines = []
    # Per process group: each rank's last enqueued / completed collective, and what each
    # collective was, by its sequence number.
    groups = {}
    for rank, d in dumps.items():
        for pg, status in (d.get("pg_status") or {}).items():
            g = groups.setdefault(str(pg), {"enq": {}, "done": {}, "ops": {}, "name": ""})
            g["enq"][rank] = as_int(status.get("last_enqueued_collective"))
            g["done"][rank] = as_int(status.get("last_completed_collective"))
        for e in d.get("entries") or []:
            pg = str(e.get("pg_id", ""))
            g = groups.setdefault(pg, {"enq": {}, "done": {}, "ops": {}, "name": ""})
            seq = as_int(e.get("collective_seq_id"))
            if seq >= 0:
                g["ops"].setdefault(seq, {})[rank] = e.get("profiling_name") or "?"
            pgname = e.get("process_group")
            if isinstance(pgname, (list, tuple)) and len(pgname) > 1 and pgname[1]:
                g["name"] = str(pgname[1])

    for pg in sorted(groups, key=lambda p: (as_int(p, 1 << 30), p)):
        g = groups[pg]
        if not g["enq"]:
            continue
        label = f"process group {pg}" + (f" ({g['name']})" if g["name"] else "")

        def op(seq, ranks=None):
            by = g["ops"].get(seq, {})
            names = {by[r] for r in (ranks or by) if r in by}
            return "/".join(sorted(names)) if names else "?"

        # A collective the ranks disagree on: the first sequence number with two names.
        disagree = False
        for seq in sorted(g["ops"]):
            by = g["ops"][seq]
            names = {}
            for r, n in by.items():
                names.setdefault(n, []).append(r)
            if len(names) > 1:
                parts = "; ".join(f"{n} on {who(rs)}" for n, rs in sorted(names.items(), key=lambda x: (len(x[1]), x[0])))
                lines.append(f"{label}: the ranks disagree on collective #{seq}: {parts}")
                disagree = True
                break

        top = max(g["enq"].values())
        behind = {}
        for r, e in g["enq"].items():
            if e < top:
                behind.setdefault(e, []).append(r)
        ahead = [r for r, e in g["enq"].items() if e == top]
        if behind:
            for e, rs in sorted(behind.items()):
                last = f"its last was #{e} ({op(e, rs)})" if e > 0 else "it entered none"
                lines.append(f"{label}: {who(rs)} never entered collective #{top} ({op(top, ahead)}) that "
                             f"{who(ahead)} entered; {last}")
        elif top > 0 and not disagree:
            done = [r for r in ahead if g["done"].get(r, -1) >= top]
            not_done = [r for r in ahead if g["done"].get(r, -1) < top]
            if not_done:
                tail = f", completed on {who(done)}, not on {who(not_done)}" if done else ", completed on none"
                lines.append(f"{label}: every rank entered collective #{top} ({op(top)}){tail}")
            else:
                lines.append(f"{label}: every rank completed collective #{top} ({op(top)}), the last one recorded")

    for rank, why in sorted(unreadable.items()):
        lines.append(f"rank {rank}: its dump cannot be read ({why})")
    print(f"Flight recorder, torch's ring of recent collectives ({who(list(dumps))} dumped):")
    for line in lines or ["no collective recorded"]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
