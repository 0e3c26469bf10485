# The Python half of an airhost rank, compiled into airhost-rank as a string and run in
# the rank's interpreter before user code. It never puts anything on sys.path, so a
# rank's import system is exactly what `python train.py` would see. The text of
# runtime/python/airhost/_by_value.py comes first in that string (bootstrap_py.hpp.in): its walk of
# the functions that travel by value is the caller's too (by_value_functions, code_key).
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
    if _original_excepthook is sys.__excepthook__:
        # Python's own printing, as the C one prints it, but through linecache: the lines of a
        # notebook cell (sent by the caller, in no file here) show as the caller's Python shows them.
        try:
            import traceback

            traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
            sys.stderr.flush()
            return
        except Exception:
            pass
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


# The launch's MLflow run is made beside the ranks' start, not before it (host/cli/tracking.hpp,
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


# The scheduler's warning that the job's time is nearly up (Slurm's --signal=USR1@90) reaches
# the host, which passes SIGUSR1 (or SIGUSR2) to every rank. Their default action would kill
# the rank; instead it is recorded here for airhost.preemption_requested(). A handler the
# training code installs later (Lightning's, say) replaces this one, as it should.
def _on_warning(signum, frame):
    _airhost_rank.warning_signal = signum


def _watch_warnings():
    import signal

    _airhost_rank.warning_signal = 0
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.SIG_IGN, _on_warning):
            signal.signal(sig, _on_warning)
    # airhost-rank blocked them while it started (rank_main.cpp): one that came meanwhile is
    # delivered now, to the handler above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGUSR1, signal.SIGUSR2))


# `airhost stacks` and Ctrl-\ on the host: a thread of airhost's own in the rank (C, outside
# Python) writes its Python stacks into <run_dir>/stacks/rank-N.dump when the host asks on the
# control channel, without the GIL and without a signal (runtime/rank_module.cpp,
# host/launch/watch/stacks.hpp). The host makes stacks/; without it (a rank outside airhost) nothing
# is started.
def _watch_stacks():
    run_dir, rank = os.environ.get("AIRHOST_RUN_DIR"), os.environ.get("RANK")
    if run_dir and rank and os.path.isdir(os.path.join(run_dir, "stacks")):
        _airhost_rank.watch_stacks(os.path.join(run_dir, "stacks", f"rank-{rank}.dump"))


def install():
    sys.excepthook = _excepthook
    _watch_warnings()
    _watch_stacks()
    if os.environ.get("AIRHOST_MLFLOW_RETRY") == "1":
        sys.meta_path.insert(0, _PatchSqlStoreOnImport())
    pending = os.environ.get("AIRHOST_MLFLOW_PENDING", "")
    if pending:
        sys.meta_path.insert(0, _BindMlflowRunOnImport(pending))


# ---- results ------------------------------------------------------------------------
#
# A return value of up to INLINE_LIMIT bytes travels inside a `result` frame. A larger one
# never goes through a pipe: it is pickled (protocol 5, the storage of tensors and arrays out
# of band, so it is written once, straight from where it lies) into shared memory, a memfd
# sealed once written, or, when shared memory lacks room, an unnamed file (O_TMPFILE) in the
# run directory's results/; the descriptor goes to the host with SCM_RIGHTS (a `result_fd`
# frame). The layout is documented with airhost::ResultBlob (include/airhost/report.hpp).
# Nothing of it has a name: a rank that dies while writing leaves nothing and sends nothing.

INLINE_LIMIT = 64 << 10
_RESULT_MAGIC = b"AHRESULT"
_RESULT_HEADER = 64  # magic + 7 u64: version, total, stream offset, stream length, table offset, count, 0
_ALIGN = 64


class ResultStorageError(RuntimeError):
    """The result fits neither in shared memory nor in the run directory."""

    def __reduce__(self):  # this module is not importable in the caller: arrive as RuntimeError
        return RuntimeError, self.args


def _memory_available():
    """Bytes that memory can still take: MemAvailable, or what this cgroup allows if less."""
    best = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    best = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/self/cgroup") as f:
            group = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
        if group is not None:
            base = "/sys/fs/cgroup" + group.rstrip("/")
            with open(base + "/memory.max") as f:
                most = f.read().strip()
            if most != "max":
                with open(base + "/memory.current") as f:
                    room = int(most) - int(f.read())
                best = room if best is None else min(best, room)
    except (OSError, ValueError):
        pass
    return best


def _shm_limit():
    """The most bytes of shared memory a result of this rank may take: AIRHOST_RESULT_SHM_LIMIT,
    else half of the memory available, shared among the node's ranks (they all return at once,
    and the caller then holds the results)."""
    value = os.environ.get("AIRHOST_RESULT_SHM_LIMIT", "").strip()
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            sys.stderr.write(f"airhost: AIRHOST_RESULT_SHM_LIMIT={value!r} is not a number of bytes; ignored\n")
    available = _memory_available()
    if available is None:
        return 1 << 62
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(0, available // (2 * ranks))


def _size(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def _align(n, to=_ALIGN):
    return (n + to - 1) // to * to


class _ResultWriter:
    """The file the result's pickler writes to: memory while the result is small (it then goes
    inline), then a memfd, or an unnamed file in the run directory past the shared-memory limit
    (moving what the memfd already holds). finish() appends the out-of-band buffers, the table
    and the header, and seals the memfd."""

    def __init__(self):
        self.rank = os.environ.get("RANK", "?")
        self.small = bytearray()
        self.fd = -1
        self.where = None
        self.pos = 0
        self.limit = 0
        self.directory = None
        self.why = "shared memory cannot take it"

    # -- what the pickler calls
    def write(self, data):
        n = memoryview(data).nbytes
        if self.fd < 0:
            if len(self.small) + n <= INLINE_LIMIT:
                self.small += data
                return n
            self._open(_RESULT_HEADER + len(self.small) + n)
        self._room(self.pos + n)
        self._write(data)
        return n

    # -- storage
    def _open(self, need):
        self.limit = _shm_limit()
        if need <= self.limit:
            try:
                self.fd = os.memfd_create("airhost-result", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                self.where = "shm"
            except (AttributeError, OSError) as e:
                self._open_file(need, f"shared memory (memfd) is not available here ({e})")
        else:
            self._open_file(need, self._over_limit())
        self._write(bytes(_RESULT_HEADER))
        if self.small:
            self._write(self.small)
            self.small = bytearray()

    def _over_limit(self):
        return (
            f"the result needs more than the {_size(self.limit)} of shared memory this rank may use "
            "(half the memory available, shared among the ranks, or AIRHOST_RESULT_SHM_LIMIT)"
        )

    def _room(self, end):
        if self.where == "shm" and end > self.limit:
            self._spill(end)

    def _spill(self, end):
        old, n = self.fd, self.pos
        self.fd = -1
        try:
            self._open_file(end, self._over_limit())
            done = 0
            while done < n:
                try:
                    try:
                        sent = os.sendfile(self.fd, old, done, n - done)
                    except OSError as e:
                        if e.errno == 28:  # ENOSPC: no use trying another way
                            raise
                        chunk = os.pread(old, min(n - done, 1 << 24), done)
                        sent = os.write(self.fd, chunk) if chunk else 0
                except OSError as e:
                    raise self._error(e) from e
                if sent <= 0:
                    raise self._error(OSError(5, "the result could not be moved out of shared memory"))
                done += sent
            self.pos = n
        finally:
            os.close(old)

    def _open_file(self, need, why):
        import errno

        run_dir = os.environ.get("AIRHOST_RUN_DIR") or __import__("tempfile").gettempdir()
        self.directory = os.path.join(run_dir, "results")
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            try:
                fd = os.open(self.directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
            except (AttributeError, OSError) as e:
                if getattr(e, "errno", None) not in (None, errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    raise
                # No O_TMPFILE on this filesystem: a name for a moment. The host removes what a
                # rank killed in between leaves (.rank-*.partial).
                path = os.path.join(self.directory, f".rank-{self.rank}-{os.getpid()}.partial")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                os.unlink(path)
        except OSError as e:
            raise self._error(e) from e
        self.fd, self.where, self.pos, self.why = fd, "file", 0, why
        sys.stderr.write(f"airhost: rank {self.rank}: {why}; writing it to an unnamed file in {self.directory}\n")
        self._reserve(need)

    def _reserve(self, end):
        """Claims the file's blocks before writing them: a full disk fails here, at once."""
        if self.where != "file":
            return
        try:
            os.posix_fallocate(self.fd, 0, end)
        except OSError as e:
            import errno

            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise self._error(e) from e

    def _error(self, e):
        where = self.directory or os.path.join(os.environ.get("AIRHOST_RUN_DIR", "?"), "results")
        return ResultStorageError(
            f"rank {self.rank} cannot store its result in {where}: {getattr(e, 'strerror', None) or e} "
            f"(and {self.why}); free space there, or return less data"
        )

    def _write(self, data):
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += os.write(self.fd, view[done:])
        except OSError as e:
            raise self._error(e) from e
        self.pos += done

    def finish(self, buffers):
        """Appends the out-of-band buffers, the table and the header. Returns None when the
        whole result is `self.small` (an inline frame), else (fd, size, where)."""
        import struct

        raws = [b.raw() for b in buffers]
        if self.fd < 0:
            if not raws:
                return None
            self._open(_RESULT_HEADER + len(self.small) + sum(_align(r.nbytes) for r in raws))
        stream_length = self.pos - _RESULT_HEADER
        offsets, end = [], self.pos
        for r in raws:
            end = _align(end)
            offsets.append(end)
            end += r.nbytes
        table = _align(end, 8)
        total = table + 16 * len(raws)
        self._room(total)
        self._reserve(total)
        for offset, r in zip(offsets, raws):
            if offset > self.pos:
                self._write(bytes(offset - self.pos))
            self._write(r)
        if table > self.pos:
            self._write(bytes(table - self.pos))
        self._write(b"".join(struct.pack("<QQ", o, r.nbytes) for o, r in zip(offsets, raws)))
        header = struct.pack("<8s7Q", _RESULT_MAGIC, 1, total, _RESULT_HEADER, stream_length, table, len(raws), 0)
        try:
            os.pwrite(self.fd, header, 0)
            if self.where == "shm":
                import fcntl

                seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
        except OSError as e:
            raise self._error(e) from e
        return self.fd, total, self.where

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Reduced:
    """Pickles as `fn(*args)`."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _reduce_tensor(pickler, torch, t):
    """A CPU tensor as torch's own functions over its storage's bytes: as_strided(view(
    from_numpy(uint8 array of the storage), dtype), size, stride, offset). The array goes out of
    band, so the storage is written once and the caller's tensor lies in the mapped result;
    views of one storage stay views of one storage. torch's default pickling (torch.save of the
    storage into a bytes object) is kept for everything else, and for small storages."""
    try:
        if (
            t.layout != torch.strided
            or t.device.type != "cpu"
            or t.requires_grad
            or t.is_quantized
            or t.is_nested
            or t.is_conj()
            or t.is_neg()
            or getattr(t, "__dict__", None)
        ):
            return None
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes < INLINE_LIMIT or nbytes % t.element_size():
            return None
        key = (storage.data_ptr(), nbytes)
        refs = pickler.airhost_storages
        raw = refs.get(key)
        if raw is None:
            flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))
            raw = refs[key] = _Reduced(torch.from_numpy, (flat.numpy(),))  # numpy missing: default path
        typed = refs.get((key, t.dtype))
        if typed is None:
            typed = refs[(key, t.dtype)] = _Reduced(torch.Tensor.view, (raw, t.dtype))
        return torch.as_strided, (typed, tuple(t.size()), tuple(t.stride()), t.storage_offset())
    except Exception:
        return None


_result_pickler_class = None


def _result_pickler(file, buffer_callback):
    global _result_pickler_class
    if _result_pickler_class is None:
        try:
            import cloudpickle

            base = getattr(cloudpickle, "CloudPickler", None) or cloudpickle.Pickler
        except ImportError:
            import pickle

            base = pickle.Pickler

        class ResultPickler(base):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.airhost_storages = {}

            def reducer_override(self, obj):
                torch = sys.modules.get("torch")
                if torch is not None and type(obj) is torch.Tensor:
                    reduced = _reduce_tensor(self, torch, obj)
                    if reduced is not None:
                        return reduced
                parent = getattr(super(), "reducer_override", None)
                return parent(obj) if parent is not None else NotImplemented

        _result_pickler_class = ResultPickler
    return _result_pickler_class(file, protocol=5, buffer_callback=buffer_callback)


def _write_result(value, writer):
    """Pickles `value` into `writer`; returns the out-of-band buffers, in stream order."""
    buffers = []

    def out_of_band(buffer):
        try:
            if buffer.raw().nbytes < INLINE_LIMIT:
                return True  # small: in the stream
        except BufferError:
            return True  # not contiguous: pickle copies it in band
        buffers.append(buffer)
        return False

    _result_pickler(writer, out_of_band).dump(value)
    return buffers


def _send_result(value, result_format="pickle"):
    writer = _ResultWriter()
    try:
        try:
            if result_format == "json":
                import json

                writer.write(json.dumps(value).encode())
                buffers = []
            else:
                buffers = _write_result(value, writer)
        except ResultStorageError:
            raise
        except Exception as e:
            rank = os.environ.get("RANK", "?")
            raise TypeError(
                f"the return value of rank {rank} ({type(value).__name__}) cannot be sent as {result_format}: {e}; "
                "return plain data (numbers, lists, dicts, tensors) instead"
            ) from e
        sent = writer.finish(buffers)
        if sent is None:
            _airhost_rank.send_result(bytes(writer.small))
        else:
            _airhost_rank.send_result_fd(*sent)  # the host gets a descriptor of its own
    finally:
        writer.close()


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


def _restore_filenames(roots, files, fallback):
    """Every function that came by value (cloudpickle names its file "<dynamic-code>") gets the
    file it was defined in back, from the caller's map {(qualname, first line): filename}: so
    tracebacks, `airhost stacks` and hang reports name a helper's file (or notebook cell) and
    line, as plain Python does. `fallback`: the decorated function's file, for what the map
    lacks (a payload of an older caller). The walk is the caller's own: by_value_functions and
    code_key come from runtime/python/airhost/_by_value.py, put ahead of this file in airhost-rank."""
    for fn in by_value_functions(roots, lambda f: f.__code__.co_filename == "<dynamic-code>"):
        code = fn.__code__
        filename = files.get(code_key(code), fallback if fn is roots[0] else None)
        if filename:
            try:
                fn.__code__ = _with_filename(code, filename)
            except Exception:
                pass


def _load_pickled(path):
    import linecache
    import pickle

    with open(path, "rb") as f:
        meta = pickle.load(f)  # plain data: sys.path must be in place before the function loads
        sys.path[:] = meta["sys_path"]
        fn, args, kwargs = pickle.load(f)
    # A notebook cell's source is in no file here: the caller sent its lines, for tracebacks.
    for filename, lines in (meta.get("sources") or {}).items():
        linecache.cache[filename] = (sum(map(len, lines)), None, list(lines), filename)
    try:
        _restore_filenames([fn, args, kwargs], meta.get("files") or {}, meta.get("filename"))
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


def _skip_torch_library_teardown():
    """torch keeps a weakref.finalize per torch.library.Library (about 130 after `import
    torch`) that takes its operators out of the dispatcher at exit: some 40 ms of CPU per rank,
    half a warm call's end on 4 ranks of 2 cores, for tables that no one outside this process
    can see, since it _exits next. Those finalizers, and only those, are left out of the atexit
    run; every other finalizer still runs."""
    library = sys.modules.get("torch.library")
    deregister = getattr(library, "_del_library", None)
    if deregister is None:
        return
    import weakref

    try:
        for f in list(getattr(weakref.finalize, "_registry", {})):
            info = f.peek()  # (obj, func, args, kwargs), or None once dead
            if info is not None and info[1] is deregister:
                f.atexit = False
    except Exception:
        pass  # another CPython's weakref: run them all, slower but the same


def exit_quickly(code):
    """What Python's own exit does that a program can see, for a function rank that the host
    then ends with _exit: wait for non-daemon threads, run atexit callbacks (logging.shutdown,
    weakref finalizers, mlflow's flushes and the like), flush stdout and stderr. Returns the exit
    code. Tearing every module down, torch's above all, takes a second or more of CPU per rank
    and delays the end of the run, and with it the results, for nothing; multiprocessing ends
    its workers the same way. What is skipped: __del__ of objects still alive, so a file
    object left open and unflushed in a module global loses its buffer.
    AIRHOST_RANK_FINALIZE=1 keeps the full interpreter finalization."""
    import atexit
    import threading

    try:
        threading._shutdown()
    except Exception:
        pass
    _skip_torch_library_teardown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            code = code or 120  # what Py_FinalizeEx makes of a flush that fails
    return code
