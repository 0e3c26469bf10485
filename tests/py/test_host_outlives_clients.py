"""The host outlives every client (issue 32): a malformed request on the run's stacks socket,
a client that leaves before its answer in a program that embeds libairhost, and run
directories that are the user's alone, however the run was started.
"""
from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import connect_unix, wait_for

ROOT = Path(__file__).resolve().parents[2]
BUILD = os.environ.get("AIRHOST_TEST_BUILD_DIR", str(ROOT / "build" / "dev"))

pytestmark = pytest.mark.timeout(300)

SLEEPER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    Path(sys.argv[1], f"ready-{os.environ['RANK']}").touch()
    while not Path(sys.argv[1], "release").exists():
        time.sleep(0.05)
    print("rank", os.environ["RANK"], "done", flush=True)
""")


def ask(sock_path: Path, request: bytes, read: bool = True) -> bytes:
    s = connect_unix(sock_path)  # blocking: waits while the host's backlog is full, as a CLI client does
    s.settimeout(30)
    s.sendall(request)
    answer = b""
    if read:
        while chunk := s.recv(65536):
            answer += chunk
    s.close()
    return answer


def test_a_malformed_stacks_request_gets_one_error_and_the_run_goes_on(airhost, tmp_path):
    # Defect 1: a refused sampling followed by more bytes used to be answered on every read,
    # until the host died of SIGSEGV with its run.json "running".
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    gate = tmp_path / "gate"
    gate.mkdir()
    started = airhost.start(str(tmp_path / "sleeper.py"), "-n", "2", "--", str(gate))
    run_dir = started.run_dir()
    wait_for(lambda: all((gate / f"ready-{r}").exists() for r in (0, 1)), 60, "both ranks running")
    sock = run_dir / "host.sock"
    wait_for(sock.exists, 30, "the stacks socket")
    for request in (b"stacks sample=50\n" + b"x" * 600, b"stacks sample=-1\nstacks\nstacks\n" * 20,
                    b"hello\n" + b"\n" * 300, b"stacks sample=99999999999999999999\n" + bytes(range(256))):
        answer = ask(sock, request)
        assert answer.count(b"error:") == 1 and answer.endswith(b"\n"), answer[:300]
    # 2,000 more: random bytes with and without a line's end, oversized lines, requests cut
    # off, and clients that leave at once, before any answer. The host neither dies nor stops
    # serving; a request it can parse is answered once.
    import random

    rng = random.Random(32)
    for i in range(2000):
        pick = rng.random()
        if pick < 0.4:
            junk = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))).replace(b"stacks", b"")
            answer = ask(sock, junk + b"\n")
            assert answer.count(b"error:") <= 1, answer[:200]
        elif pick < 0.6:
            ask(sock, b"x" * rng.randint(257, 5000), read=False)  # a line that never ends
        elif pick < 0.8:
            ask(sock, b"stacks sample=" + str(rng.randint(-10**6, 99)).encode() + b"\n", read=False)
        else:
            ask(sock, b"stacks\n" if i % 40 == 0 else b"stac", read=False)
    answer = ask(sock, b"stacks\n")
    assert b"2 ranks in 1 group" in answer and b"sleeper.py:6" in answer, answer
    (gate / "release").touch()
    run = started.finish(timeout=60)
    assert run.rc == 0, run.describe()
    assert run.run_json["outcome"] == "succeeded", run.run_json
    for r in (0, 1):
        assert f"[rank {r}] rank {r} done".encode() in run.stdout


def test_a_stacks_client_leaving_early_does_not_kill_a_program_that_embeds_libairhost(tmp_path):
    # Defect 2: the answer written to a client that had left raised SIGPIPE, which only the
    # CLI ignores: the embedding program died (141) and its run.json stayed "running".
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        pytest.skip("needs the dev build (scripts/test.sh makes it)")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True, capture_output=True)
    build = tmp_path / "embed"
    subprocess.run(["cmake", "-S", str(ROOT / "examples" / "embed_cpp"), "-B", str(build), "-G", "Ninja",
                    f"-DCMAKE_PREFIX_PATH={prefix}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    gate = tmp_path / "gate"
    gate.mkdir()
    fn = tmp_path / "fn.py"
    fn.write_text(textwrap.dedent(f"""
        import os, time
        from pathlib import Path

        def train():
            Path({str(gate)!r}, "ready-" + os.environ["RANK"]).touch()
            while not Path({str(gate)!r}, "release").exists():
                time.sleep(0.05)
            return int(os.environ["RANK"])
    """))
    runs = tmp_path / "runs"
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(runs), AIRHOST_TRACKING="0")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    # The program starts with SIGPIPE at its default, as any program does unless it says otherwise.
    demo = subprocess.Popen([str(build / "embed_demo"), str(fn), "train", "2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=lambda: __import__("signal").signal(
                                __import__("signal").SIGPIPE, __import__("signal").SIG_DFL))
    try:
        wait_for(lambda: all((gate / f"ready-{r}").exists() for r in (0, 1)), 60, "both ranks running")
        run_dir = next(p for p in runs.iterdir() if p.is_dir())
        for _ in range(5):
            ask(run_dir / "host.sock", b"stacks\n", read=False)
        time.sleep(4)  # the answers are written (each waits up to 3 s for the ranks) to clients long gone
        (gate / "release").touch()
        out, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, out
    assert "outcome: succeeded (exit 0)" in out, out


def test_the_python_api_makes_its_runs_root_and_run_directory_the_users_alone(tmp_path):
    # Defect 9: os.makedirs(..., mode=0o700) set the mode of the last folder only.
    runs = tmp_path / "new" / "runs"
    code = textwrap.dedent("""
        from airhost import distributed

        @distributed(num_accelerators=1, tracking=False)
        def f():
            return 1

        print(f.distributed())
    """)
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(runs), AIRHOST_TRACKING="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1
    for d in (tmp_path / "new", runs, run_dirs[0], run_dirs[0] / "logs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, (d, oct(d.stat().st_mode))


@pytest.mark.parametrize("key, sig, rc, status", [("ctrl-backslash", "SIGQUIT", 0, "FINISHED"),
                                                  ("ctrl-c", "SIGINT", 130, "KILLED")])
def test_the_terminals_signals_reach_the_host_not_its_mlflow_helper(airhost_bin, tmp_path, key, sig, rc, status):
    # Defect 3: the MLflow helper was in the terminal's foreground group; Ctrl-\ killed it (a
    # core dump) and Ctrl-C too, before it marked the run: the run stayed RUNNING for good.
    # Here the host leads a session of its own, and the key is a signal to its whole group,
    # as a terminal sends it.
    pytest.importorskip("mlflow")
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    gate = tmp_path / "gate"
    gate.mkdir()
    runs = tmp_path / "runs"
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(runs), AIRHOST_TRACKING="1", MLFLOW_TRACKING_URI=uri,
               MLFLOW_EXPERIMENT_NAME=key)
    host = subprocess.Popen([airhost_bin, str(tmp_path / "sleeper.py"), "-n", "1", "--", str(gate)], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: (gate / "ready-0").exists(), 60, "the rank running")
        run_dir = next(p for p in runs.iterdir() if p.is_dir())
        wait_for(lambda: (run_dir / "tracking.env").exists(), 120, "the MLflow run made by the helper")
        os.killpg(host.pid, getattr(__import__("signal"), sig))
        time.sleep(1.0)
        (gate / "release").touch()
        out, _ = host.communicate(timeout=120)
    finally:
        if host.poll() is None:
            host.kill()
    assert host.returncode == rc, out
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient()
    found = client.search_runs([client.get_experiment_by_name(key).experiment_id])
    assert [r.info.status for r in found] == [status], out
    assert found[0].info.end_time, "the helper ended the run"


def warm_frame(kind: int, fields: dict[str, bytes], magic: int) -> bytes:
    import struct

    body = b"".join(struct.pack("<I", len(k)) + k + struct.pack("<Q", len(v)) + v for k, v in
                    ((k.encode(), v) for k, v in fields.items()))
    return struct.pack("<IHHQ", magic, kind, 0, len(body)) + body


def test_the_warm_server_outlives_thousands_of_malformed_and_truncated_requests(airhost, tmp_path):
    # The warm server's socket takes requests from any process of the user: none of them, however
    # malformed (a length past the end, a name not UTF-8, a frame announcing 2^60 bytes, a start
    # with no argv, a client gone mid-frame), may end the server; the next launch still forks from it.
    import random
    import re
    import struct

    magic = int(re.search(r"^MAGIC = (\S+)", (ROOT / "runtime" / "warm.py").read_text(), re.M).group(1), 0)
    state = tmp_path / "state"
    env = airhost.env(tmp_path / "runs", {"AIRHOST_STATE_DIR": str(state)})
    r = subprocess.run([airhost.binary, "warm", "start", "--preload", "none"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    sock = state / "warm.sock"
    try:
        hello = warm_frame(1, {"version": b"0", "env": b"A=1\0B=2"}, magic)
        crafted = [
            struct.pack("<IHHQ", magic, 1, 0, 5) + b"\xff\xff\xff\xff\x00",  # a name's length past the end
            struct.pack("<IHHQ", magic, 1, 0, 4) + b"\x02\x00\x00\x00",      # cut off
            struct.pack("<IHHQ", magic, 1, 0, 14) + struct.pack("<I", 2) + b"\xff\xfe" + struct.pack("<Q", 0),  # a name not UTF-8
            warm_frame(1, {"env": b"\xff\xfe=\x80"}, magic),                   # env not UTF-8
            warm_frame(3, {"rank": b"\xff"}, magic),                           # a start: no argv, no descriptors
            warm_frame(99, {}, magic),                                        # a kind of a later version
            struct.pack("<IHHQ", magic, 1, 0, 1 << 60),                        # 2^60 bytes announced
            struct.pack("<IHHQ", 0xDEADBEEF, 1, 0, 0),                         # not airhost's
            hello[:7], hello[:20],                                             # gone mid-frame
        ]
        rng = random.Random(32)
        mutated = []
        for _ in range(3000):
            b = bytearray(rng.choice([hello, *crafted]))
            for _ in range(rng.randint(1, 6)):
                if b and rng.random() < 0.7:
                    b[rng.randrange(len(b))] = rng.randrange(256)
                else:
                    b[rng.randrange(len(b) + 1):rng.randrange(len(b) + 1)] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 9)))
            mutated.append(bytes(b))
        for request in crafted + mutated:
            s = connect_unix(sock)
            s.settimeout(5)
            try:
                s.sendall(request)
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
            except OSError:
                pass
            s.close()
        status = subprocess.run([airhost.binary, "warm", "status"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and "warm server pid" in status.stdout, status.stdout + status.stderr
        # And it still forks ranks for a launch.
        (tmp_path / "hello.py").write_text("import os\nprint('rank', os.environ['RANK'], 'up', flush=True)\n")
        run = subprocess.run([airhost.binary, str(tmp_path / "hello.py"), "-n", "2"], env=env, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "warm start" in run.stderr, run.stderr
        assert "[rank 1] rank 1 up" in run.stdout
        log = (state / "warm.log").read_text()
        assert "Traceback" not in log, log[-3000:]
        assert "dropped a client" in log
    finally:
        subprocess.run([airhost.binary, "warm", "stop"], env=env, capture_output=True, timeout=60)


def test_node_0_outlives_a_flood_of_junk_on_its_port_during_the_join(airhost, tmp_path):
    # Node 0 listens for the other nodes before any rank starts: 1,000 connections that send
    # random bytes, frame headers announcing terabytes, 100 KB of noise or nothing at all leave
    # it waiting for the real node 1, and the job then runs on both.
    import random
    import struct

    from conftest import free_port

    port = free_port()
    (tmp_path / "hello.py").write_text("import os\nprint('rank', os.environ['RANK'], 'up', flush=True)\n")
    common = [str(tmp_path / "hello.py"), "-n", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port",
              str(port), "--join-timeout", "120", "--cold"]
    env = airhost.env(tmp_path / "runs")
    err_path = tmp_path / "node0.stderr"
    node0 = subprocess.Popen([airhost.binary, *common, "--node-rank", "0"], env=env, stdout=subprocess.DEVNULL,
                             stderr=open(err_path, "w"), cwd=tmp_path)
    try:
        def listening():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(listening, 30, "node 0 listening")
        rng = random.Random(7)
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                pick = rng.random()
                if pick < 0.3:
                    s.sendall(bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))))
                elif pick < 0.6:
                    s.sendall(struct.pack("<IHHQ", rng.randrange(1 << 32), rng.randrange(1 << 16), 0, rng.randrange(1 << 40)))
                elif pick < 0.8:
                    s.sendall(rng.randbytes(rng.randint(1000, 100_000)))
            except OSError:
                pass  # node 0 may close on us mid-send: that is its right
            s.close()
        assert node0.poll() is None, "node 0 died of the flood"
        node1 = subprocess.run([airhost.binary, *common, "--node-rank", "1"], env=env, capture_output=True, text=True,
                               timeout=180, cwd=tmp_path)
        node0.wait(timeout=180)
        err0 = err_path.read_text()
    finally:
        if node0.poll() is None:
            node0.kill()
    assert node1.returncode == 0, node1.stdout + node1.stderr
    assert node0.returncode == 0, err0[-3000:]
    assert "[rank 1] rank 1 up" in node1.stdout
    assert "ignored a connection from 127.0.0.1: it does not speak airhost's node link" in err0
    # Named one by one only at first (5 every 10 s), then counted: the flood does not flood the log.
    named = err0.count("ignored a connection from 127.0.0.1")
    assert 1 <= named <= 5 * (1 + 120 // 10), err0[-3000:]
    counted = [int(m) for m in re.findall(r"refused or ignored (\d+) more connection\(s\) within 10 s", err0)]
    assert counted and named + sum(counted) >= 500, err0[-3000:]  # 720 of the 1,000 say something
