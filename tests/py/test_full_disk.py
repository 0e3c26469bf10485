"""A full disk is said out loud and loses nothing that can be kept: two ranks flood a run
directory on a 4 MiB file system (a real tmpfs mounted for the test, root only). The run
goes on, the console gets every line, one line names each log that stops, where and why,
the summary says the logs are incomplete, and run.json still records how the run ended."""
import json
import os
import subprocess

import pytest

from conftest import script

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tiny(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_logs_that_fill_the_disk_are_named_the_run_goes_on_and_its_record_is_whole(airhost, tiny):
    root = tiny / "runs"
    lines, width = 5000, 2000  # 10 MB a rank, 20 MB in all, on 4 MiB
    done = subprocess.run([airhost.binary, script("flood.py"), "-n", "2", "--", str(lines), str(width)],
                          cwd=airhost.work, env=airhost.env(root), capture_output=True, timeout=100)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-2000:]
    out = done.stdout.decode()
    for rank in range(2):
        got = [line for line in out.splitlines() if line.startswith(f"[rank {rank}] {rank}:")]
        assert len(got) == lines, (rank, len(got))  # the console got every line
    stops = [line for line in err.splitlines() if "stops at byte" in line]
    assert stops and all("No space left on device" in line and "the console still gets every line" in line
                         for line in stops), err[-2000:]
    assert "the logs of this run are incomplete" in err
    [run_dir] = [p for p in root.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["exit_code"] == 0, record
    assert len(record["incomplete_logs"]) == len(stops), record["incomplete_logs"]
    assert not list(run_dir.glob("*.tmp")) and not (run_dir / ".run.json.reserve").exists()
    # Where a log stops is where its bytes end: what it holds is whole up to there.
    for line in record["incomplete_logs"]:
        path = line.split("its log ", 1)[1].split(" stops at byte ")[0]
        at = int(line.split(" stops at byte ")[1].split(":")[0])
        assert os.path.getsize(path) == at, line


def test_log_max_size_keeps_the_head_and_the_tail_and_says_what_was_cut(airhost, tmp_path):
    root = tmp_path / "runs"
    lines = 2000
    done = subprocess.run([airhost.binary, script("flood.py"), "-n", "2", "--log-max-size", "64K", "--", str(lines), "100"],
                          cwd=airhost.work, env=airhost.env(root), capture_output=True, timeout=100)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-2000:]
    for rank in range(2):  # the console is not bounded
        assert sum(line.startswith(f"[rank {rank}] {rank}:") for line in done.stdout.decode().splitlines()) == lines
    [run_dir] = [p for p in root.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    assert len(record["trimmed_logs"]) == 2 and record["state"] == "succeeded", record
    for rank in range(2):
        log = (run_dir / "logs" / f"rank-{rank}.stdout.log").read_bytes()
        assert len(log) <= 64 * 1024 + 200, len(log)
        text = log.decode()
        assert text.startswith(f"{rank}:00000:") and text.endswith(f":{rank}:{lines - 1:05d}:end\n")
        [mark] = [line for line in text.splitlines() if line.startswith("----- airhost: ")]
        cut = int(mark.split()[2])
        assert cut > 0 and f"rank {rank}: its log" in err and f"{cut} bytes between were cut" in err
    assert not list((run_dir / "logs").glob("*.tail*"))
