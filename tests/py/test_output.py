"""Rank output end to end: prefixes, filters, stream separation, whole lines under load,
partial and huge lines, raw bytes, and output printed just before a crash."""
import re

import pytest

from conftest import script, split_lines

pytestmark = pytest.mark.timeout(90)


def test_every_console_line_is_prefixed_with_its_rank(airhost):
    run = airhost(script("hello.py"), "-n", "3")
    run.assert_rc(0)
    for stream, data in (("stdout", run.stdout), ("stderr", run.stderr)):
        for line in split_lines(data):
            if stream == "stderr" and line.startswith(b"airhost: run "):
                continue  # the host's own closing line
            assert re.match(rb"^\[rank [0-2]\] ", line), line
    assert b"[rank 2] hello from rank 2 of 3\n" in run.stdout
    assert b"[rank 1] note from rank 1\n" in run.stderr
    run.assert_console_matches_logs()
    run.assert_logs_complete()


def test_no_prefix_forwards_lines_as_they_are(airhost):
    run = airhost("--no-prefix", script("hello.py"), "-n", "2")
    run.assert_rc(0)
    assert sorted(split_lines(run.stdout)) == sorted(split_lines(run.log(0)) + split_lines(run.log(1)))
    rank_err = [line for line in split_lines(run.stderr) if not line.startswith(b"airhost: ")]
    assert sorted(rank_err) == [b"note from rank 0", b"note from rank 1"]
    assert b"[rank" not in run.stdout + run.stderr
    run.assert_logs_complete()


def test_ranks_filter_shows_only_those_ranks_while_the_logs_keep_every_rank(airhost):
    run = airhost("--ranks", "0", script("hello.py"), "-n", "3")
    run.assert_rc(0)
    assert set(run.console("stdout")) == {0} and set(run.console("stderr")) == {0}
    run.assert_console_matches_logs(ranks=[0])
    for n in (1, 2):
        assert run.log(n) == f"hello from rank {n} of 3\nargv [\"{script('hello.py')}\"]\n".encode()
        assert run.log(n, "stderr") == f"note from rank {n}\n".encode()
    run.assert_logs_complete()


def test_ranks_filter_with_several_ranks(airhost):
    run = airhost("--ranks", "0,2", script("hello.py"), "-n", "3")
    run.assert_rc(0)
    assert set(run.console("stdout")) == {0, 2}
    run.assert_console_matches_logs(ranks=[0, 2])
    run.assert_logs_complete()


def test_rank_stdout_goes_to_host_stdout_and_stderr_to_host_stderr(airhost):
    run = airhost(script("hello.py"), "-n", "2")
    run.assert_rc(0)
    out, err = run.console("stdout"), run.console("stderr")
    for n in (0, 1):
        assert out[n][0] == f"hello from rank {n} of 2".encode()
        assert err[n] == [f"note from rank {n}".encode()]
        assert b"note from" not in b"".join(out[n])
    assert b"note from" not in run.stdout
    assert b"hello from" not in run.stderr
    run.assert_logs_complete()


@pytest.mark.timeout(120)
def test_lines_of_concurrent_ranks_are_never_torn_or_interleaved(airhost):
    lines, width = 2000, 1500
    run = airhost(script("flood.py"), "-n", "4", "--", lines, width)
    run.assert_rc(0)
    seen = {n: [] for n in range(4)}
    all_lines = split_lines(run.stdout)
    assert run.stdout.endswith(b"\n")
    for line in all_lines:
        m = re.match(rb"^\[rank ([0-3])\] ", line)
        assert m, f"line without a rank prefix: {line[:80]!r}"
        rank = int(m.group(1))
        parts = line[m.end():].split(b":")
        whole = (len(parts) == 6 and parts[0] == parts[3] == str(rank).encode() and parts[1] == parts[4]
                 and parts[2] == bytes([ord("a") + rank]) * width and parts[5] == b"end")
        assert whole, f"torn or mixed line: {line[:80]!r}...{line[-40:]!r} ({len(line)} bytes)"
        seen[rank].append(int(parts[1]))
    for n in range(4):
        assert seen[n] == list(range(lines)), f"rank {n}: lines lost or out of order"
    assert len(all_lines) == 4 * lines
    run.assert_logs_complete()
    run.assert_console_matches_logs()


def test_a_last_line_without_newline_is_flushed(airhost):
    run = airhost(script("partial_line.py"), "-n", "2")
    run.assert_rc(0)
    for n in (0, 1):
        assert run.log(n) == f"first line of rank {n}\nlast words of rank {n} without a newline".encode()
        assert run.log(n, "stderr") == f"stderr without newline from rank {n}".encode()
        assert f"[rank {n}] last words of rank {n} without a newline\n".encode() in run.stdout
        assert f"[rank {n}] stderr without newline from rank {n}\n".encode() in run.stderr
    run.assert_console_matches_logs()
    run.assert_logs_complete()


@pytest.mark.timeout(120)
def test_a_10_mb_line_without_newline_reaches_log_and_console_whole(airhost):
    run = airhost(script("big_line.py"), "-n", "1")
    run.assert_rc(0)
    expected = "".join(f"{i:09d}|" for i in range(1_000_000)).encode()
    log = run.log(0)
    assert len(log) == 10_000_000
    assert log == expected
    assert run.stdout == b"[rank 0] " + expected + b"\n"
    run.assert_logs_complete()


def test_non_utf8_bytes_pass_through_byte_exact(airhost):
    run = airhost(script("raw_bytes.py"), "-n", "1")
    run.assert_rc(0)
    assert run.log(0) == b"\xff\xfe bad \x00 nul\nlatin-1 caf\xe9\n"
    assert run.log(0, "stderr") == b"\xc3\x28 invalid \x80 continuation\n"
    assert run.stdout == b"[rank 0] \xff\xfe bad \x00 nul\n[rank 0] latin-1 caf\xe9\n"
    assert run.stderr.startswith(b"[rank 0] \xc3\x28 invalid \x80 continuation\n")
    run.assert_logs_complete()


@pytest.mark.parametrize("how, code", [("segv", 139), ("osexit", 5), ("sigkill", 137)])
def test_output_printed_right_before_a_crash_is_in_the_log(airhost, how, code):
    run = airhost(script("crash_after_print.py"), "-n", "2", "--grace", "5", "--", how)
    run.assert_rc(code)
    assert run.rank(1)["state"] == "failed"
    log = run.log(1)
    assert log.endswith(b"rank 1 last words on stdout\n")
    assert len(split_lines(log)) == 101
    assert len(split_lines(run.log(0))) == 100
    assert run.log(1, "stderr").startswith(b"rank 1 last words on stderr\n")
    assert b"[rank 1] rank 1 last words on stdout\n" in run.stdout
    run.assert_logs_complete(exact_stderr=(how != "segv"))
    run.assert_console_matches_logs()
