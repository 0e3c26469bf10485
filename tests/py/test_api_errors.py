"""Python API: how a failing run reaches the caller. A rank's exception is a DistributedError
(a RuntimeError) naming the rank, carrying the remote traceback and the rank's own exception
as __cause__; a killed rank names its signal; a run past its timeout is a TimeoutError."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "api_scripts"))
import _helpers  # noqa: E402
from _fixtures import api_tmp  # noqa: E402,F401
from _helpers import run_scenario  # noqa: E402

ERRORS = _helpers.script("errors.py")


@pytest.mark.timeout(60)
def test_a_value_error_on_one_rank_is_a_distributed_error_with_the_remote_traceback_and_the_value_error_as_cause(api_tmp):
    err = run_scenario(api_tmp, "errors.py", "value_error").ok().result
    assert err["type"] == "DistributedError", err
    assert "RuntimeError" in err["mro"]
    assert err["failed_ranks"] == [1]
    message = err["message"]
    assert "rank 1" in message and "ValueError: bad learning rate on rank 1" in message, message
    # The remote traceback names the user's file and the line that raised.
    line = _helpers.line_of(ERRORS, "RAISE-VALUE-ERROR")
    assert f'File "{ERRORS}", line {line}, in fails_on_rank_1' in message, message
    assert "Remote traceback of rank 1" in message
    assert err["cause_type"] == "ValueError"
    assert err["cause_args"] == [repr("bad learning rate on rank 1")]
    assert err["run_dir"] and Path(err["run_dir"]).parent == _helpers.runs_dir(api_tmp)
    assert err["ranks_left"] == []


@pytest.mark.timeout(60)
def test_an_exception_class_defined_in_main_is_rebuilt_as_that_class_with_its_state(api_tmp):
    err = run_scenario(api_tmp, "errors.py", "custom_error").ok().result
    assert err["type"] == "DistributedError", err
    assert err["failed_ranks"] == [1]
    assert "TrainingDiverged" in err["message"]
    assert f"line {_helpers.line_of(ERRORS, 'RAISE-CUSTOM')}" in err["message"]
    assert err["cause_type"] == "TrainingDiverged"
    assert err["cause_is_main_class"] is True, "the cause is not an instance of the caller's class"
    assert err["cause_state"] == [float("inf"), 42]
    assert err["cause_args"] == [repr("the loss diverged")]


@pytest.mark.timeout(60)
def test_an_exception_python_cannot_unpickle_still_gives_its_type_message_and_traceback_without_a_cause(api_tmp):
    err = run_scenario(api_tmp, "errors.py", "unrebuildable").ok().result
    assert err["type"] == "DistributedError", err
    assert err["failed_ranks"] == [0]
    assert "Unrebuildable: loss nan at step 7" in err["message"], err["message"]
    assert f"line {_helpers.line_of(ERRORS, 'RAISE-UNREBUILDABLE')}" in err["message"]
    assert err["cause_type"] is None


@pytest.mark.timeout(90)
def test_a_rank_killed_by_sigkill_is_a_distributed_error_naming_the_rank_and_the_signal(api_tmp):
    err = run_scenario(api_tmp, "errors.py", "sigkill").ok().result
    assert err["type"] == "DistributedError", err
    assert 1 in err["failed_ranks"]
    assert "rank 1" in err["message"] and "SIGKILL" in err["message"], err["message"]
    assert err["ranks_left"] == []
    # Rank 0 slept for 30 s: the run stopped it rather than waiting for it.
    assert err["seconds"] < 25, err


@pytest.mark.timeout(60)
def test_timeout_of_two_seconds_stops_a_sleeping_run_with_a_timeout_error_within_a_few_seconds(api_tmp):
    caller = run_scenario(api_tmp, "errors.py", "timeout").ok()
    err = caller.result
    assert err["type"] == "TimeoutError", err
    assert "timed out after 2 s" in err["message"], err["message"]
    assert err["seconds"] < 8, err
    assert err["ranks_left"] == []
    assert "[rank 0] sleeping" in caller.out and "[rank 1] sleeping" in caller.out


HELPERS = '''
from airhost import distributed

def helper(x):
    y = x + 1
    raise ValueError(f"helper says {y}")  # HELPER-RAISES

class Step:
    def go(self):
        return helper(1)  # METHOD-CALLS

@distributed(num_accelerators=1, tracking=False)
def run():
    return Step().go()

try:
    run.distributed()
except Exception as e:
    print("ERR", e)
'''


def test_every_function_of_the_callers_main_names_its_file_and_line(tmp_path):
    # #33 item 5: a helper of the caller's __main__ showed as File "<dynamic-code>" with no
    # source line; only the decorated function had its file.
    import os
    import subprocess
    import sys

    caller = tmp_path / "caller.py"
    caller.write_text(HELPERS)
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(tmp_path / "runs"), AIRHOST_TRACKING="0",
               AIRHOST_TEST_MARK=str(tmp_path) + os.sep)
    r = subprocess.run([sys.executable, str(caller)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "<dynamic-code>" not in out + r.stderr, out
    for marker, function in (("METHOD-CALLS", "go"), ("HELPER-RAISES", "helper")):
        line = next(i for i, text in enumerate(HELPERS.splitlines(), 1) if marker in text)
        assert f'File "{caller}", line {line}, in {function}\n' in out, out
        assert HELPERS.splitlines()[line - 1].strip() in out, out  # the source line, as python shows it


KWDEFAULT_HELPER = '''
from airhost import distributed

def helper(x):
    y = x + 1
    raise ValueError(f"helper says {y}")  # HELPER-RAISES

@distributed(num_accelerators=1, tracking=False)
def run(*, step=helper):
    return step(1)

try:
    run.distributed()
except Exception as e:
    print("ERR", e)
'''


def test_a_helper_reached_only_as_a_keyword_only_default_names_its_file_and_line(tmp_path):
    # The rank's walk once skipped __kwdefaults__ (review D1): `helper` showed as <dynamic-code>.
    import os
    import subprocess

    caller = tmp_path / "caller.py"
    caller.write_text(KWDEFAULT_HELPER)
    env = dict(os.environ, AIRHOST_RUNS_DIR=str(tmp_path / "runs"), AIRHOST_TRACKING="0")
    r = subprocess.run([sys.executable, str(caller)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "<dynamic-code>" not in r.stdout + r.stderr, r.stdout
    line = _helpers.line_of(str(caller), "HELPER-RAISES")
    assert f'File "{caller}", line {line}, in helper\n' in r.stdout, r.stdout


# The rank's Python half as airhost-rank embeds it (runtime/bootstrap_py.hpp.in, filled in by
# CMake), run in a plain interpreter on a payload of the caller's: the walk of both ends,
# without building airhost-rank.
RANK_SIDE = r'''
import sys, traceback, types
root, payload = sys.argv[1], sys.argv[2]
template = open(f"{root}/runtime/bootstrap_py.hpp.in").read()
source = template.split('R"AIRHOST_PY(', 1)[1].rsplit(')AIRHOST_PY"', 1)[0]
source = source.replace("@AIRHOST_BY_VALUE_PY@", open(f"{root}/runtime/python/airhost/_by_value.py").read())
source = source.replace("@AIRHOST_BOOTSTRAP_PY@", open(f"{root}/runtime/bootstrap.py").read())
sys.modules["_airhost_rank"] = types.ModuleType("_airhost_rank")
bootstrap = types.ModuleType("_airhost_bootstrap")
exec(compile(source, "<airhost bootstrap>", "exec"), bootstrap.__dict__)
fn, args, kwargs = bootstrap._load_pickled(payload)
try:
    fn(*args, **kwargs)
except ValueError:
    traceback.print_exc(file=sys.stdout)
'''

CALLER_SIDE = '''
import sys
from airhost import _payload

def helper(x):
    y = x + 1
    raise ValueError(f"helper says {y}")  # HELPER-RAISES

def by_default(x, step=helper):
    return step(x)  # BY-DEFAULT

def run(*, step=by_default):
    return step(1)

with open(sys.argv[1], "wb") as f:
    for part in _payload.build(run, (), {}):
        f.write(part)
'''


def test_the_rank_gives_back_the_file_of_every_by_value_function_the_caller_walked(tmp_path):
    # The caller notes where each function of its __main__ came from (_payload.py); the rank
    # walks what it unpickled with the same walk (_by_value.py) to give each its file back:
    # through a keyword-only default, then a default, here.
    import subprocess

    caller, payload = tmp_path / "caller.py", tmp_path / "payload.pkl"
    caller.write_text(CALLER_SIDE)
    made = subprocess.run([sys.executable, str(caller), str(payload)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", RANK_SIDE, str(root), str(payload)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ValueError: helper says 2" in r.stdout, r.stdout + r.stderr
    assert "<dynamic-code>" not in r.stdout, r.stdout
    for marker, function in (("BY-DEFAULT", "by_default"), ("HELPER-RAISES", "helper")):
        line = _helpers.line_of(str(caller), marker)
        assert f'File "{caller}", line {line}, in {function}\n' in r.stdout, r.stdout
