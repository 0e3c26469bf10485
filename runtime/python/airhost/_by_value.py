"""The functions that travel by value, found by one walk for both ends of a payload.

cloudpickle sends the functions of `__main__` (a script, a notebook cell) by value and names
their file "<dynamic-code>". The caller (_payload.py) walks the function and its arguments to
note where each such function was defined; the rank (runtime/bootstrap.py) walks what it
unpickled to give each one its file back, so that tracebacks, `airhost stacks` and hang reports
name the user's file and line. Both walk the same graph with this code.

The rank cannot import it from the package: airhost-rank runs the user's interpreter with the
user's sys.path, which need not hold airhost (`airhost run --python`), and `import airhost`
would cost every rank tens of milliseconds. So CMake puts this file's text ahead of
bootstrap.py's in airhost-rank, as it puts _usage_metrics.py into the CLI's MLflow helper.
Hence: the standard library only, no import of the package, no `from __future__`, and no name
that bootstrap.py defines too.
"""
import functools
import types

WALK_LIMIT = 10_000  # objects visited at most: a name for tracebacks is not worth a long walk


def code_key(code):
    """What names a function at both ends: (qualified name, first line)."""
    return (getattr(code, "co_qualname", code.co_name), code.co_firstlineno)


def by_value_functions(roots, travels_by_value):
    """Yields each function reachable from `roots` for which `travels_by_value(fn)` is true, then
    walks on from it through the globals its code names, its closure, its defaults and its
    keyword-only defaults. Containers (lists, tuples, sets, dicts' values), partials, methods,
    static and class methods, and the attributes of classes defined in __main__ are walked
    through. The caller may change a yielded function's __code__ (not the names it uses)."""
    seen, stack = set(), list(roots)
    while stack and len(seen) < WALK_LIMIT:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, type) and obj.__module__ == "__main__":
            stack.extend(vars(obj).values())
        elif isinstance(obj, (staticmethod, classmethod)):
            stack.append(obj.__func__)
        elif isinstance(obj, functools.partial):
            stack.extend((obj.func, obj.args, obj.keywords))
        elif isinstance(obj, types.MethodType):
            stack.append(obj.__func__)
        elif isinstance(obj, types.FunctionType) and travels_by_value(obj):
            yield obj
            g = obj.__globals__
            stack.extend(g[n] for n in code_names(obj.__code__) if n in g)
            stack.extend(c.cell_contents for c in (obj.__closure__ or ()) if cell_has_value(c))
            stack.extend(obj.__defaults__ or ())
            stack.extend((obj.__kwdefaults__ or {}).values())


def code_names(code):
    """The names a code object and the code nested in it (inner functions, lambdas,
    comprehensions) use: every global it can read is among them."""
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            names |= code_names(c)
    return names


def cell_has_value(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:  # a closure variable not yet assigned
        return False
