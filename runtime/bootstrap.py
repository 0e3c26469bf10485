# The Python half of an airhost rank, compiled into airhost-rank as a string and run in
# the rank's interpreter before user code. It never puts anything on sys.path, so a
# rank's import system is exactly what `python train.py` would see.
import os
import sys
import time

import _airhost_rank

FRAME_RESULT = 2
FRAME_ERROR = 3


def _qualified_name(exc_type):
    module = getattr(exc_type, "__module__", "builtins")
    name = getattr(exc_type, "__qualname__", exc_type.__name__)
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


def _dumps(obj):
    # cloudpickle when the user's environment has it (values of classes defined in
    # __main__ or a notebook travel by value); plain pickle otherwise.
    try:
        import cloudpickle
    except ImportError:
        import pickle

        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(obj)


def report_exception(exc_type, exc, tb):
    """Send the error frame for an exception the rank is about to die of."""
    import traceback

    try:
        formatted = "".join(traceback.format_exception(exc_type, exc, tb))
    except Exception:  # a broken __str__ must not hide the failure itself
        formatted = f"{_qualified_name(exc_type)}: <unprintable exception>\n"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable exception>"
    try:
        pickled = _dumps(exc)
    except Exception:
        pickled = b""
    try:
        _airhost_rank.send_error(
            _qualified_name(exc_type), message, formatted, pickled, repr(time.time())
        )
    except Exception:
        pass  # the host is gone or the channel broke; stderr still has the traceback


_original_excepthook = sys.excepthook


def _excepthook(exc_type, exc, tb):
    report_exception(exc_type, exc, tb)
    _original_excepthook(exc_type, exc, tb)


# mlflow on SQLite (its default store) answers "database is locked" at once, without
# waiting, when two processes upgrade read transactions to writes together: with ranks
# logging metrics into one run, points would be lost. When airhost created the run on such
# a store (AIRHOST_MLFLOW_RETRY=1), its writes are retried. The patch is applied only if and
# when the user's code imports mlflow's SQL store, so a rank pays nothing otherwise.
_SQL_STORE = "mlflow.store.tracking.sqlalchemy_store"
_RETRIED = ("log_metric", "log_batch", "log_param", "set_tag", "log_inputs", "log_outputs")


def _with_retry(method):
    import functools
    import random

    @functools.wraps(method)
    def retrying(*args, **kwargs):
        for attempt in range(60):
            try:
                return method(*args, **kwargs)
            except Exception as e:
                if "database is locked" not in str(e) or attempt == 59:
                    raise
                time.sleep(min(0.5, 0.01 * 2**attempt) * (0.5 + random.random()))

    return retrying


class _PatchSqlStoreOnImport:
    def find_spec(self, name, path, target=None):
        if name != _SQL_STORE:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            store = getattr(module, "SqlAlchemyStore", None)
            for attr in _RETRIED:
                if store is not None and hasattr(store, attr):
                    setattr(store, attr, _with_retry(getattr(store, attr)))

        spec.loader.exec_module = exec_and_patch
        return spec


# The launch's MLflow run is made beside the ranks' start, not before it (host/tracking.hpp,
# airhost/_tracking.py): AIRHOST_MLFLOW_PENDING names the file where its variables will be.
# Only a rank that uses mlflow needs them, so they are bound when mlflow is imported
# (executed, not merely looked up: find_spec probes of Lightning and friends bind nothing).
# The rank then asks for the run (PATH.want), imports mlflow while the host's helper makes
# the run, and waits for the file only after that. mlflow reads these variables when first
# used, not at import. A rank that never imports mlflow never waits.
_MLFLOW_WAIT = 120.0  # seconds; a tracking server that slow must not hold training hostage


def _ask_for_mlflow_run(path):
    try:
        os.close(os.open(path + ".want", os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        pass


def _bind_mlflow_run(path):
    start = time.monotonic()
    said = False
    while not os.path.exists(path):
        waited = time.monotonic() - start
        if waited > _MLFLOW_WAIT:
            sys.stderr.write(f"airhost: no MLflow run after {_MLFLOW_WAIT:.0f} s; mlflow goes on without it\n")
            return
        if not said and waited > 10:
            sys.stderr.write("airhost: waiting for the launch's MLflow run to be created\n")
            said = True
        time.sleep(0.01)
    try:
        with open(path) as f:
            pairs = [line.rstrip("\n").split("=", 1) for line in f if "=" in line]
    except OSError:
        return
    values = dict(pairs)
    if "NONE" in values:
        return
    for key, value in values.items():
        os.environ.setdefault(key, value)  # a variable the user set for the rank wins


class _BindMlflowRunOnImport:
    def __init__(self, path):
        self.path = path

    def find_spec(self, name, path, target=None):
        if name != "mlflow":
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        hook = self

        def bind_around_exec(module):
            if hook not in sys.meta_path:
                return exec_module(module)
            sys.meta_path.remove(hook)
            _ask_for_mlflow_run(hook.path)
            # Whatever store the run turns out to be on, SQLite's retry must be in place
            # before mlflow imports its SQL store; on any other store it is never triggered.
            if not any(isinstance(f, _PatchSqlStoreOnImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _PatchSqlStoreOnImport())
            exec_module(module)
            _bind_mlflow_run(hook.path)

        spec.loader.exec_module = bind_around_exec
        return spec


def install():
    sys.excepthook = _excepthook
    if os.environ.get("AIRHOST_MLFLOW_RETRY") == "1":
        sys.meta_path.insert(0, _PatchSqlStoreOnImport())
    pending = os.environ.get("AIRHOST_MLFLOW_PENDING", "")
    if pending:
        sys.meta_path.insert(0, _BindMlflowRunOnImport(pending))


def _send_result(value, result_format="pickle"):
    try:
        if result_format == "json":
            import json

            payload = json.dumps(value).encode()
        else:
            payload = _dumps(value)
    except Exception as e:
        rank = os.environ.get("RANK", "?")
        raise TypeError(
            f"the return value of rank {rank} ({type(value).__name__}) cannot be sent as {result_format}: {e}; "
            "return plain data (numbers, lists, dicts, tensors) instead"
        ) from e
    _airhost_rank.send_result(payload)


def _load_script_function(path, function):
    import importlib.util

    directory = os.path.dirname(os.path.realpath(path))
    sys.path.insert(0, directory)  # as `python train.py` would
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so pickling a class defined there works by reference
    spec.loader.exec_module(module)
    return _attribute(module, function, path)


def _load_module_function(module_name, function):
    import importlib

    import importlib.util

    sys.path.insert(0, os.getcwd())  # as `python -m` would
    # Like `python -m` (runpy), sys.argv[0] is the module's file while it is imported: find it
    # first (this imports the parent packages, as runpy does), then import the module.
    spec = importlib.util.find_spec(module_name)
    if spec is not None and spec.has_location and spec.origin:
        sys.argv[0] = spec.origin
    module = importlib.import_module(module_name)
    return _attribute(module, function, module_name)


def _attribute(module, function, where):
    try:
        fn = getattr(module, function)
    except AttributeError:
        raise AttributeError(f"{where} has no function {function!r}") from None
    if not callable(fn):
        raise TypeError(f"{where}:{function} is not callable")
    return fn


def _with_filename(code, filename):
    # cloudpickle drops co_filename of functions it sends by value; put the caller's back so
    # remote tracebacks name the user's file.
    consts = tuple(_with_filename(c, filename) if hasattr(c, "co_filename") else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _load_pickled(path):
    import pickle

    with open(path, "rb") as f:
        meta = pickle.load(f)  # plain data: sys.path must be in place before the function loads
        sys.path[:] = meta["sys_path"]
        fn, args, kwargs = pickle.load(f)
    filename = meta.get("filename")
    code = getattr(fn, "__code__", None)
    if filename and code is not None and code.co_filename == "<dynamic-code>":
        try:
            fn.__code__ = _with_filename(code, filename)
        except Exception:
            pass
    return fn, args, kwargs


def exit_status(e):
    """The process exit code for SystemExit `e`, as the python command turns it into one:
    None is 0, an int is itself, anything else is printed to stderr and is 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def run_function(kind, target, function, result_format="pickle"):
    """Entry point for `train.py:main`, `-m mod:main` and the Python API. Returns the exit code."""
    try:
        args, kwargs = (), {}
        if kind == "function-script":
            fn = _load_script_function(target, function)
        elif kind == "function-module":
            fn = _load_module_function(target, function)
        else:
            fn, args, kwargs = _load_pickled(target)
        _send_result(fn(*args, **kwargs), result_format)
        return 0
    except SystemExit as e:
        return exit_status(e)
    except BaseException:
        exc_type, exc, tb = sys.exc_info()
        # Drop our frames and importlib's from what the user sees: the traceback starts in
        # their code.
        while tb.tb_next and tb.tb_frame.f_code.co_filename.startswith(("<airhost bootstrap>", "<frozen importlib")):
            tb = tb.tb_next
        exc.__traceback__ = tb
        sys.excepthook(exc_type, exc, tb)
        return 1
