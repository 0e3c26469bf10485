"""The command line end to end: help, version, targets (script, function, module),
arguments, interpreter, config file, and the usage errors that start nothing."""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import SCRIPTS, VENV_BIN, script, split_lines

pytestmark = pytest.mark.timeout(60)

SUCCESS_RE = r"airhost: run \S+: {n} rank\(s\) succeeded in [\d.]+ s \(logs: {logs}\)"


def assert_succeeded(run, n):
    run.assert_rc(0)
    assert re.search(SUCCESS_RE.format(n=n, logs=re.escape(str(run.run_dir / "logs"))), run.err), run.describe()
    assert run.run_json["outcome"] == "succeeded"
    assert run.run_json["exit_code"] == 0
    assert [r["rank"] for r in run.ranks] == list(range(n))
    assert all(r["state"] == "succeeded" and r["exit_code"] == 0 for r in run.ranks)


def json_lines(run, rank):
    return [json.loads(line) for line in split_lines(run.log(rank, "stdout")) if line.startswith(b"{")]


def assert_nothing_started(run):
    run.assert_rc(2)
    assert run.run_dir is None, "a usage error must start nothing, not even a run directory"
    assert run.stdout == b""
    assert "Run 'airhost --help' for usage." in run.err


# ---- help and version ----------------------------------------------------------------------


def test_help_prints_the_usage_and_exits_0(airhost):
    for flag in ("--help", "-h"):
        run = airhost(flag)
        run.assert_rc(0)
        assert run.out.startswith("usage: airhost [flags] SCRIPT.py")
        for text in ("-m MODULE[:FUNCTION]", "--accelerators N", "--timeout D", "--grace D", "--no-prefix",
                     "--ranks LIST", "--env KEY=VALUE", "Exit status:", "124"):
            assert text in run.out
        assert run.err == ""
        assert run.run_dir is None


def test_version_prints_the_version_and_exits_0(airhost):
    for flag in ("--version", "-V"):
        run = airhost(flag)
        run.assert_rc(0)
        assert re.fullmatch(r"airhost \d+\.\d+\.\d+\S*\n", run.out), run.out
        assert run.run_dir is None


def test_help_wins_over_an_otherwise_wrong_command_line(airhost):
    run = airhost("--frobnicate", "--help")
    run.assert_rc(0)
    assert run.out.startswith("usage: airhost")


# ---- script arguments and flags --------------------------------------------------------------


def test_script_arguments_after_the_double_dash_reach_sys_argv_exactly(airhost):
    target = script("hello.py")
    args = ["--lr", "0.1", "", "with space", "--", "-n", "2", "ünïcödé", "a=b", "--timeout=3", "-m", "x.y"]
    run = airhost(target, "-n", "2", "--", *args)
    assert_succeeded(run, 2)
    for n in (0, 1):
        lines = split_lines(run.log(n, "stdout"))
        assert lines[0] == f"hello from rank {n} of 2".encode()
        assert json.loads(lines[1][len(b"argv "):]) == [target, *args]
    assert run.run_json["entry"]["args"] == args
    run.assert_logs_complete()
    run.assert_console_matches_logs()


def test_flags_after_the_script_apply_to_the_run(airhost):
    run = airhost(script("hello.py"), "-n", "3", "--no-prefix", "--timeout=30")
    assert_succeeded(run, 3)
    # --no-prefix: the console has the bare lines of all three ranks
    assert sorted(split_lines(run.stdout)) == sorted(
        line for n in range(3) for line in split_lines(run.log(n, "stdout")))
    assert not any(line.startswith(b"[rank ") for line in split_lines(run.stdout))
    run.assert_logs_complete()


# ---- function targets ---------------------------------------------------------------------------


def test_a_script_function_target_returns_each_ranks_value_in_results_pickles(airhost):
    target = script("train_fn.py")
    run = airhost(f"{target}:main", "-n", "3", "--", "--epochs", "2")
    assert_succeeded(run, 3)
    assert run.run_json["entry"]["kind"] == "function"
    assert run.run_json["entry"]["function"] == "main"
    for n in range(3):
        assert run.rank(n)["has_result"] is True
        with open(run.run_dir / "results" / f"rank-{n}.pkl", "rb") as f:
            value = pickle.load(f)
        assert value == {"rank": n, "world_size": 3, "name": "train_fn", "argv": [target, "--epochs", "2"],
                         "square": n * n}
        # imported as a module (not __main__), then main() called once
        assert run.log(n, "stdout") == f"imported on rank {n} as train_fn\nmain() on rank {n}\n".encode()
    run.assert_logs_complete()
    run.assert_console_matches_logs()


def test_the_results_directory_holds_only_the_result_pickles(airhost):
    run = airhost(f"{script('train_fn.py')}:main", "-n", "2")
    run.assert_rc(0)
    assert sorted(os.listdir(run.run_dir / "results")) == ["rank-0.pkl", "rank-1.pkl"]


def test_a_script_run_as_a_script_has_no_results(airhost):
    run = airhost(script("train_fn.py"), "-n", "2")
    assert_succeeded(run, 2)
    assert not (run.run_dir / "results").exists()
    assert all(r["has_result"] is False for r in run.ranks)
    assert run.log(1, "stdout") == b"imported on rank 1 as __main__\nrun as __main__\n"
    run.assert_logs_complete()


def make_package(work):
    pkg = work / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(textwrap.dedent("""\
        import json, os, sys
        print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                          "file": __file__, "rank": os.environ.get("RANK")}), flush=True)

        def main():
            return {"rank": int(os.environ["RANK"]), "name": __name__, "argv": sys.argv,
                    "path0": sys.path[0]}
        """))
    return pkg


def test_a_module_target_runs_as_main_with_the_working_directory_first_on_sys_path(airhost, work):
    make_package(work)
    run = airhost("-m", "pkg.mod", "-n", "2", "--", "a", "--b")
    assert_succeeded(run, 2)
    assert run.run_json["entry"]["kind"] == "module"
    python = subprocess.run([sys.executable, "-m", "pkg.mod", "a", "--b"], cwd=work, capture_output=True,
                            text=True, check=True, env={k: v for k, v in os.environ.items() if k != "RANK"})
    expected = json.loads(python.stdout)
    for n in (0, 1):
        [seen] = json_lines(run, n)
        assert seen["rank"] == str(n)
        assert seen["name"] == "__main__" == expected["name"]
        assert seen["path0"] == str(work) == expected["path0"]
        assert seen["argv"] == expected["argv"] == [str(work / "pkg" / "mod.py"), "a", "--b"]
        assert seen["file"] == expected["file"]
    run.assert_console_matches_logs()


def test_a_module_function_target_calls_it_and_keeps_the_results(airhost, work):
    make_package(work)
    run = airhost("-m", "pkg.mod:main", "-n", "2", "--", "x")
    assert_succeeded(run, 2)
    assert run.run_json["entry"] == {"kind": "function", "target": "pkg.mod", "function": "main", "args": ["x"]}
    for n in (0, 1):
        with open(run.run_dir / "results" / f"rank-{n}.pkl", "rb") as f:
            value = pickle.load(f)
        assert value["rank"] == n
        assert value["name"] == "pkg.mod"
        # sys.argv[0] is the module's file, as python -m leaves it, already while it imports.
        assert value["argv"] == [str(work / "pkg" / "mod.py"), "x"]
        assert value["path0"] == str(work)  # as python -m would
        [seen] = json_lines(run, n)
        assert seen["name"] == "pkg.mod"
        assert seen["argv"] == [str(work / "pkg" / "mod.py"), "x"]
    run.assert_console_matches_logs()


# ---- the interpreter and its view of the script ---------------------------------------------------


@pytest.mark.parametrize("how", ["relative", "absolute", "symlink"])
def test_sys_path_0_and_main_of_a_script_match_python_running_it(airhost, work, how):
    sub = work / "sub"
    sub.mkdir()
    shutil.copy(SCRIPTS / "introspect.py", sub / "introspect.py")
    if how == "relative":
        target = "sub/introspect.py"
    elif how == "absolute":
        target = str(sub / "introspect.py")
    else:
        (work / "links").mkdir()
        os.symlink("../sub/introspect.py", work / "links" / "link.py")
        target = "links/link.py"
    run = airhost(target, "-n", "2", "--", "arg1")
    assert_succeeded(run, 2)
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    python = subprocess.run([sys.executable, target, "arg1"], cwd=work, env=env, capture_output=True, text=True,
                            check=True)
    expected = json.loads(python.stdout)
    for n in (0, 1):
        [seen] = json_lines(run, n)
        for key in ("name", "file", "argv", "path0", "cwd"):
            assert seen[key] == expected[key], key
    assert expected["name"] == "__main__" and expected["path0"] == str(sub)
    run.assert_console_matches_logs()


def test_ranks_use_the_interpreter_and_packages_of_the_venv_airhost_is_installed_in(airhost):
    run = airhost(script("uses_torch.py"), "-n", "2")
    assert_succeeded(run, 2)
    prefix = subprocess.run([sys.executable, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True, check=True).stdout.strip()
    for n in (0, 1):
        seen = json.loads(run.log(n, "stdout"))
        assert os.path.dirname(seen["executable"]) == VENV_BIN
        assert os.path.realpath(seen["executable"]) == os.path.realpath(sys.executable)
        assert seen["prefix"] == sys.prefix == prefix
        assert seen["torch_file"].startswith(os.path.join(sys.prefix, "lib"))
        assert seen["torch_version"].startswith("2.")
    run.assert_logs_complete()


def test_python_flag_pointing_at_the_venv_python_is_used_by_the_ranks(airhost):
    python = os.path.join(VENV_BIN, "python")
    run = airhost("--python", python, script("introspect.py"), "-n", "2")
    assert_succeeded(run, 2)
    for n in (0, 1):
        [seen] = json_lines(run, n)
        assert seen["executable"] == python
        assert seen["prefix"] == sys.prefix
    run.assert_console_matches_logs()


def test_python_flag_naming_a_missing_interpreter_is_a_usage_error(airhost, work):
    run = airhost("--python", str(work / "no-such-python"), script("hello.py"))
    assert_nothing_started(run)
    assert f"python interpreter '{work / 'no-such-python'}' is not an executable file" in run.err


# ---- config file -------------------------------------------------------------------------------------


CONFIG = """\
accelerators = 3
timeout = "5m"

[output]
prefix = false

[env]
FROM_FILE = "file"
OVERRIDDEN = "file"
"""


def test_airhost_toml_in_the_working_directory_is_honoured(airhost, work):
    (work / "airhost.toml").write_text(CONFIG)
    run = airhost(script("show_env.py"), "--", "FROM_FILE", "OVERRIDDEN")
    assert_succeeded(run, 3)  # accelerators = 3
    assert sorted(split_lines(run.stdout)) == sorted([b"FROM_FILE=file", b"OVERRIDDEN=file"] * 3)  # prefix = false
    run.assert_logs_complete()


def test_flags_override_airhost_toml(airhost, work):
    (work / "airhost.toml").write_text(CONFIG)
    run = airhost(script("show_env.py"), "-n", "2", "--prefix", "--env", "OVERRIDDEN=flag", "--",
                  "FROM_FILE", "OVERRIDDEN")
    assert_succeeded(run, 2)
    for n in (0, 1):
        assert run.log(n, "stdout") == b"FROM_FILE=file\nOVERRIDDEN=flag\n"
    run.assert_console_matches_logs()
    run.assert_logs_complete()


def test_config_flag_reads_another_file(airhost, work):
    (work / "airhost.toml").write_text("accelerators = 3\n")
    (work / "other.toml").write_text("accelerators = 2\n[env]\nFROM_FILE = \"other\"\n")
    run = airhost("--config", "other.toml", script("show_env.py"), "--", "FROM_FILE")
    assert_succeeded(run, 2)
    assert run.log(1, "stdout") == b"FROM_FILE=other\n"


def test_bad_toml_is_a_usage_error_naming_file_line_and_column(airhost, work):
    (work / "airhost.toml").write_text('timeout = "3h"\naccelerators = = 2\n')
    run = airhost(script("hello.py"))
    assert_nothing_started(run)
    path = re.escape(str(work / "airhost.toml"))
    assert re.search(rf"^airhost: {path}:2:16: invalid TOML: ", run.err, re.M), run.err


def test_an_unknown_key_in_airhost_toml_is_a_usage_error_with_its_position(airhost, work):
    (work / "airhost.toml").write_text("accelerators = 2\ntimout = 5\n")
    run = airhost(script("hello.py"))
    assert_nothing_started(run)
    assert f"{work / 'airhost.toml'}:2:1: unknown key 'timout' (did you mean 'timeout'?)" in run.err


# ---- usage errors ----------------------------------------------------------------------------------


def test_an_unknown_flag_is_a_usage_error_naming_it(airhost):
    run = airhost("--frobnicate", script("hello.py"))
    assert_nothing_started(run)
    assert "airhost: unknown flag '--frobnicate'" in run.err


def test_a_misspelt_flag_after_the_script_suggests_the_right_one_and_the_double_dash(airhost):
    run = airhost(script("hello.py"), "--timeot", "5")
    assert_nothing_started(run)
    assert "unknown flag '--timeot' (did you mean '--timeout'?)" in run.err
    assert "script arguments go after `--`" in run.err


@pytest.mark.parametrize("value", ["0", "abc", "-1", "2.5"])
def test_accelerators_must_be_a_positive_integer(airhost, value):
    run = airhost("--accelerators", value, script("hello.py"))
    assert_nothing_started(run)
    assert f"--accelerators must be a positive integer, got '{value}'" in run.err


def test_a_missing_script_is_a_usage_error_naming_it(airhost, work):
    run = airhost("no_such_script.py", "-n", "2")
    assert_nothing_started(run)
    assert f"script 'no_such_script.py' not found (working directory {work})" in run.err


def test_nothing_to_run_is_a_usage_error(airhost):
    run = airhost("-n", "2")
    assert_nothing_started(run)
    assert "nothing to run" in run.err


def test_a_script_with_a_syntax_error_fails_with_exit_1_and_says_syntaxerror(airhost, work):
    (work / "broken.py").write_text("print('fine')\ndef broken(:\n    pass\n")
    run = airhost("broken.py", "-n", "2")
    run.assert_rc(1)
    assert run.run_json["outcome"] == "failed"
    assert re.search(r"^airhost: run \S+ failed: rank \d exited with code 1 \(SyntaxError: ", run.err, re.M), run.err
    root = run.rank(run.run_json["root_cause"])
    assert root["state"] == "failed"
    assert root["error"]["type"] == "SyntaxError"
    assert f"log: {root['stderr_log']}" in run.err
    assert f'File "{work / "broken.py"}", line 2' in run.err
    log = run.log(root["rank"], "stderr").decode()
    assert "SyntaxError" in log and f'File "{work / "broken.py"}", line 2' in log
    for n in (0, 1):
        assert run.log(n, "stdout") == b""  # nothing of the file ran
    run.assert_console_matches_logs()
