"""What a call sends its ranks: the function and its arguments, cloudpickled, after a plain
pickle of what the rank needs before it can unpickle them (sys.path) and what names the
functions that travel by value (their files, and the lines of those in no file). The Python
API (_api.py) writes it into the run directory, a Job (_jobs.py) hands it to `airhost submit`;
the rank reads it in runtime/bootstrap.py (_load_pickled)."""
from __future__ import annotations

import io
import os
import pickle
import sys
import warnings

from ._by_value import by_value_functions, code_key

LARGE_PAYLOAD = 256 << 20


def _cloudpickle():
    try:
        import cloudpickle
    except ImportError as e:  # a dependency of the package; only a broken install lacks it
        raise ImportError("airhost needs cloudpickle to send functions to ranks: pip install cloudpickle") from e
    return cloudpickle


def dumps(obj) -> bytes:
    """cloudpickle.dumps, knowing torch.ops: a function from __main__ whose code says
    `torch.ops` (custom ops, DeepSpeed) makes cloudpickle look up "torch.ops" in sys.modules,
    where torch registers an `_Ops` object, not a module, which it then fails to pickle. It
    travels as what it is: an attribute of the torch module."""
    cp = _cloudpickle()

    class Pickler(cp.CloudPickler):
        def reducer_override(self, obj):
            t = type(obj)
            if t.__name__ == "_Ops" and t.__module__ == "torch._ops":
                return getattr, (sys.modules["torch"], "ops")
            return super().reducer_override(obj)

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _describe_unpicklable(fn, args, kwargs) -> str:
    candidates = [(f"argument {i} of {fn.__qualname__}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                candidates.append((f"the captured variable {name!r}", cell.cell_contents))
            except ValueError:
                pass
        g = getattr(fn, "__globals__", {})
        candidates += [(f"the global {n!r}", g[n]) for n in code.co_names if n in g]
    candidates.append((f"the function {fn.__qualname__}", fn))
    for what, obj in candidates:
        try:
            dumps(obj)
        except Exception as e:
            return f"{what} ({type(obj).__name__}) cannot be pickled: {e}"
    return "the function or its arguments cannot be pickled"


def _by_value_sources(*roots):
    """Where each function that travels by value came from: cloudpickle sends the functions of
    `__main__` (a script, a notebook cell) by value and names their file "<dynamic-code>". Returns
    ({(qualname, first line): filename}, {filename: source lines}) for the functions reachable
    from `roots` (_by_value.py: the rank walks the same graph to put the names back), the lines
    only for files that are not on disk (a notebook cell's), so that the rank can show them."""
    import linecache

    files, sources = {}, {}
    for fn in by_value_functions(roots, lambda f: getattr(f, "__module__", None) == "__main__"):
        code = fn.__code__
        files[code_key(code)] = code.co_filename
        if code.co_filename not in sources and not os.path.exists(code.co_filename):
            lines = linecache.getlines(code.co_filename)
            if lines:
                sources[code.co_filename] = lines
    return files, sources


def build(fn, args, kwargs) -> list:
    """The payload of a call of `fn(*args, **kwargs)`: [meta, body], to be written one after
    the other. TypeError naming what cannot be pickled, ValueError when it is too large to
    pickle at all; a ResourceWarning, pointing at the caller's call, past LARGE_PAYLOAD.
    Called by the API's own functions only, directly: the warning's stacklevel counts on it."""
    code = getattr(fn, "__code__", None)
    try:
        files, sources = _by_value_sources(fn, args, kwargs)
    except Exception:  # a name for tracebacks is never worth failing the call
        files, sources = {}, {}
    meta = pickle.dumps(
        {"sys_path": list(sys.path), "filename": code.co_filename if code else None, "format": 1,
         "files": files, "sources": sources},
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    try:
        body = dumps((fn, args, kwargs))
    except (MemoryError, OverflowError) as e:
        raise ValueError(
            f"the function and its arguments are too large to send to the ranks ({type(e).__name__}); "
            "load large data inside the function instead of capturing it"
        ) from e
    except Exception as e:
        raise TypeError(
            f"cannot send {fn.__qualname__} to the ranks: {_describe_unpicklable(fn, args, kwargs)}. "
            "Create such objects inside the function, or pass picklable data instead."
        ) from e
    if len(body) > LARGE_PAYLOAD:
        warnings.warn(
            f"{fn.__qualname__} and its arguments pickle to {len(body) / 2**30:.2f} GiB; every rank "
            "loads its own copy. Load large data inside the function instead.",
            ResourceWarning,
            stacklevel=4,
        )
    return [meta, body]  # written one after the other: no third copy of a large body
