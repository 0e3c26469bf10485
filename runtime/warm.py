# The warm server: an airhost-rank interpreter with modules preloaded (torch, say) that forks
# ranks on request, so they skip the interpreter start and the heavy imports. Compiled into
# airhost-rank as a string, like bootstrap.py, and run as module `_airhost_warm`.
#
#   airhost-rank --warm-server --socket PATH --preload auto|none|mod,mod [--parent-pid PID]
#
# host/launch/rank/warm_starter.hpp documents the protocol (frames in the control channel's codec).
# serve() returns an int (the server's exit code) in the server, and a dict (the rank's job)
# in a forked rank; airhost-rank then calls run_child(job) from a clean Python stack, so the
# user's code never runs under the server's frames.
import fcntl
import os
import signal
import socket
import struct
import sys
import time
import traceback

import _airhost_rank

MAGIC = 0x31464841
HELLO, READY, REFUSED, START, STARTED, START_FAILED, EXITED, STOP, STOPPING = range(1, 10)
KIND_NAMES = {HELLO: "hello", START: "start", STOP: "stop"}

# Modules known to start threads or hold sockets/connections at import or first use; a fork
# of a process holding them copies their state without their threads.
DENY = ("ray", "grpc", "mlflow", "wandb", "zmq", "jax", "tensorflow")

# Variables the interpreter and native libraries read once at start (sys.path, sys.flags,
# thread pools, the locale and with it stdio's encoding), or torch when it is imported (its
# logs and traces, the JIT switch, how it loads its libraries): a rank forked from the server
# has the server's values of them, so a launch whose values differ is refused rather than
# silently served with the wrong ones.
START_VARS_PREFIX = "PYTHON"
START_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH",
              "LANG", "LC_ALL", "LC_CTYPE",
              "TORCH_LOGS", "TORCH_LOGS_OUT", "TORCH_LOGS_FORMAT", "TORCH_TRACE", "TORCH_DTRACE",
              "TORCH_COMPILE_DEBUG", "TORCH_USE_RTLD_GLOBAL", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTORCH_JIT")
NOT_START_VARS = ("PYTHONUNBUFFERED",)  # every rank gets 1, and so does the server


def encode(kind, fields):
    body = b"".join(
        struct.pack("<I", len(k)) + k + struct.pack("<Q", len(v)) + v
        for k, v in ((k.encode(), v if isinstance(v, bytes) else str(v).encode()) for k, v in fields.items())
    )
    return struct.pack("<IHHQ", MAGIC, kind, 0, len(body)) + body


# A request larger than this is no request of airhost's (a hello carries the launch's
# environment, a start its argv): the client is dropped before its bytes pile up.
MAX_FRAME = 16 << 20


class MalformedRequest(ValueError):
    """Bytes on the socket that are no request of airhost's: the client is dropped, the server
    serves on."""


def decode_fields(body):
    """The fields of a request's body; MalformedRequest for anything else (a length past the
    end, a name that is not UTF-8), never an IndexError or a struct.error."""
    fields, i = {}, 0
    while i < len(body):
        if i + 4 > len(body):
            raise MalformedRequest(f"a field name's length cut off at byte {i}")
        (n,) = struct.unpack_from("<I", body, i)
        if i + 4 + n + 8 > len(body):
            raise MalformedRequest(f"a field name of {n} bytes runs past the end ({len(body)} bytes)")
        try:
            name = body[i + 4 : i + 4 + n].decode()
        except UnicodeDecodeError as e:
            raise MalformedRequest(f"a field name is not UTF-8 ({e})") from None
        i += 4 + n
        (m,) = struct.unpack_from("<Q", body, i)
        if i + 8 + m > len(body):
            raise MalformedRequest(f"field {name!r} of {m} bytes runs past the end ({len(body)} bytes)")
        fields[name] = body[i + 8 : i + 8 + m]
        i += 8 + m
    return fields


def text_field(fields, name, default=None):
    """A field as text; MalformedRequest when it is missing (and no default) or not UTF-8."""
    if name not in fields:
        if default is None:
            raise MalformedRequest(f"no {name!r} field")
        return default
    try:
        return fields[name].decode()
    except UnicodeDecodeError as e:
        raise MalformedRequest(f"field {name!r} is not UTF-8 ({e})") from None


def process_attributes():
    """What a process inherits besides its environment, in the strings the host sends in its
    hello (host/launch/rank/warm_starter.cpp, process_attributes): a forked rank has these of the
    server, a cold one those of its host."""
    import resource

    attrs = {}
    try:
        with open("/proc/self/status") as f:
            attrs["umask"] = next(line.split()[1] for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration):
        pass
    attrs["affinity"] = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    limits = {}
    for r in range(64):
        try:
            soft, hard = resource.getrlimit(r)
        except (ValueError, OSError):
            break
        limits[str(r)] = ":".join("inf" if v == resource.RLIM_INFINITY else str(v) for v in (soft, hard))
    attrs["rlimits"] = limits
    attrs["nice"] = str(os.getpriority(os.PRIO_PROCESS, 0))
    return attrs


def _rlimit_name(number):
    import resource

    names = {}
    for n in sorted(dir(resource)):  # RLIMIT_NOFILE before its alias RLIMIT_OFILE
        if n.startswith("RLIMIT_"):
            names.setdefault(getattr(resource, n), n)
    return names.get(int(number), f"resource {number}")


def attribute_difference(have, fields):
    """Why the host's attributes in `fields` (its hello) differ from the server's, or ''."""
    words = {"umask": "umask", "affinity": "CPU affinity", "nice": "nice value"}
    for key, word in words.items():
        if key not in fields or key not in have:
            continue
        want = fields[key].decode().strip()
        if want != have[key].strip():
            return f"its {word} is {have[key].strip()!r} but this launch's is {want!r}"
    if "rlimits" in fields:
        for item in fields["rlimits"].decode().split(","):
            number, _, want = item.partition("=")
            if number in have["rlimits"] and have["rlimits"][number] != want:
                return (f"its {_rlimit_name(number)} limit is {have['rlimits'][number]} (soft:hard) "
                        f"but this launch's is {want}")
    return ""


def start_vars(env):
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(START_VARS_PREFIX) and k not in NOT_START_VARS) or k in START_VARS
    }


# ---- what makes a process unsafe to fork ------------------------------------------------


def native_threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def openblas_idle_threads():
    """Worker threads of the OpenBLAS libraries loaded here (numpy's, torch's). They park on
    a condition variable and OpenBLAS shuts its pool down in a pthread_atfork handler before
    every fork, then restarts it lazily in the child: a fork after them is safe (torch's own
    DataLoader forks after `import torch` for this reason)."""
    import ctypes

    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "openblas" in os.path.basename(path) and path.startswith("/"):
                    paths.add(path)
    except OSError:
        return 0
    total = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                total += max(0, int(fn()) - 1)
                break
    return total


def cuda_initialized():
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def unsafe_reason(allowed_native):
    """Why forking this process now would not give a rank a sound copy of it, or ''."""
    import threading

    if cuda_initialized():
        return ("CUDA is initialised in the warm server (torch.cuda.is_initialized()): a forked "
                "child cannot use CUDA; preload nothing that touches the GPU at import")
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return (f"{threading.active_count() - 1} Python thread(s) besides the main one are alive "
                f"({names}); a fork copies none of them, nor any lock they hold")
    extra = native_threads() - 1 - allowed_native
    if extra > 0:
        return (f"{extra} native thread(s) besides the main one were started by the preloaded "
                "modules (not OpenBLAS's idle pool); a fork copies none of them, nor any lock they hold")
    denied = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in DENY})
    if denied:
        return (f"module(s) {', '.join(denied)} are loaded; they start threads or hold connections "
                "that a forked rank would share or lose")
    return ""


# ---- the server -------------------------------------------------------------------------


class Server:
    def __init__(self, sock_path, preload, parent_pid):
        self.sock_path = sock_path
        self.preload_spec = preload
        self.parent_pid = parent_pid
        self.started = time.time()
        self.env_at_start = dict(os.environ)
        self.attributes = process_attributes()
        self.sources = {}
        self.conns = {}  # socket -> Conn
        self.children = {}  # pid -> Conn
        self.stopping = False
        self.allowed_native = 0

    # -- preload --

    def preload(self):
        import importlib

        if self.preload_spec == "auto":
            import importlib.util

            names = [m for m in ("torch",) if importlib.util.find_spec(m) is not None]
        elif self.preload_spec in ("", "none"):
            names = []
        else:
            names = [m.strip() for m in self.preload_spec.split(",") if m.strip()]
        self.modules = names
        untrack = _track_entropy_seeded_randoms()
        try:
            for name in names:
                try:
                    importlib.import_module(name)
                except BaseException as e:
                    raise SystemExit(
                        f"airhost warm server: preload module {name!r} failed to import: "
                        f"{type(e).__name__}: {e}; fix it or leave it out of preload (cold starts still work)"
                    )
        finally:
            untrack()
        # Imports the checks and the child need, done here so a rank pays for none of them.
        import ctypes  # noqa: F401
        import runpy  # noqa: F401
        import threading  # noqa: F401
        import traceback  # noqa: F401

        self.allowed_native = openblas_idle_threads()
        self.record_sources()
        # Garbage out, then every object left (torch's hundreds of thousands) out of the
        # collector's sight: a rank's first full collection would otherwise walk them all,
        # writing to each object's header and so copying nearly every page of the preload
        # (measured: +120-280 ms of CPU and 10,000 page faults in a rank that merely
        # allocates 20,000 dicts, against 3 ms frozen). Objects made in the rank are collected
        # as usual; what the preload made is never collected there (nor returned by
        # gc.get_objects()), as CPython's gc.freeze documents for fork servers.
        import gc

        gc.collect()
        gc.freeze()

    def record_sources(self):
        for m in list(sys.modules.values()):
            path = getattr(m, "__file__", None)
            if not isinstance(path, str):
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            self.sources[path] = (st.st_mtime_ns, st.st_size)

    def changed_source(self):
        for path, (mtime, size) in self.sources.items():
            try:
                st = os.stat(path)
            except OSError:
                return path
            if st.st_mtime_ns != mtime or st.st_size != size:
                return path
        return ""

    # -- loop --

    def serve(self):
        import selectors

        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.on_term)
        for sig in (signal.SIGUSR1, signal.SIGUSR2):  # a scheduler's warning is for the ranks
            signal.signal(sig, signal.SIG_IGN)
        # Bound only once preloaded: a connection means a server ready to fork. Bound under a
        # name of its own, then renamed into place once it listens: a launch that finds the
        # socket and is refused knows its server is gone, and may remove it.
        old_umask = os.umask(0o177)
        staging = f"{self.sock_path}.{os.getpid()}"
        try:
            try:
                os.unlink(staging)
            except FileNotFoundError:
                pass
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(staging)
        finally:
            os.umask(old_umask)
        os.chmod(staging, 0o600)
        self.listener.listen(64)
        os.rename(staging, self.sock_path)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        print(f"airhost warm server {os.getpid()} ready on {self.sock_path} "
              f"(preloaded: {', '.join(self.modules) or 'nothing'})", file=sys.stderr, flush=True)
        while True:
            if self.stopping and not self.children:
                self.retire()
                return 0
            if self.parent_pid and os.getppid() != self.parent_pid:
                self.retire()
                return 0
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "listen":
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                    _, uid, _ = struct.unpack("3i", creds)
                    if uid != os.getuid():
                        conn.close()  # never serve another user
                        continue
                    self.conns[conn] = Conn(conn)
                    self.sel.register(conn, selectors.EVENT_READ, "conn")
                elif key.data == "wake":
                    try:
                        while self.wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                else:
                    job = self.on_readable(self.conns[key.fileobj])
                    if job is not None:
                        return job
            self.reap()

    def on_term(self, signum, frame):
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        self.retire()
        os._exit(128 + signum)

    def retire(self):
        try:
            if os.stat(self.sock_path).st_ino == os.fstat(self.listener.fileno()).st_ino:
                os.unlink(self.sock_path)
        except OSError:
            pass

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if conn is not None:
                conn.ranks.discard(pid)
                sig = -code if code < 0 else 0
                conn.send(EXITED, {"pid": pid, "status": 0 if sig else code, "signal": sig})

    def drop(self, c, why=""):
        # The host is gone (or done), or the client sent what no host sends: whatever of its
        # ranks still runs must not outlive it.
        if why:
            print(f"airhost warm server {os.getpid()}: dropped a client: {why}", file=sys.stderr, flush=True)
        for pid in list(c.ranks):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        self.sel.unregister(c.sock)
        del self.conns[c.sock]
        for fd in c.fds:
            os.close(fd)
        c.sock.close()

    def on_readable(self, c):
        try:
            data, fds, _, _ = socket.recv_fds(c.sock, 1 << 16, 16)
        except OSError:
            data, fds = b"", []
        c.fds.extend(fds)
        if not data:
            self.drop(c)
            return None
        c.buf += data
        while len(c.buf) >= 16:
            magic, kind, _, length = struct.unpack_from("<IHHQ", c.buf)
            if magic != MAGIC or length > MAX_FRAME:
                self.drop(c, "not an airhost request" if magic != MAGIC else f"a request of {length} bytes")
                return None
            if len(c.buf) < 16 + length:
                break
            body, c.buf = c.buf[16 : 16 + length], c.buf[16 + length :]
            # No request, however malformed, ends the server: the client that sent it is dropped.
            # (A forked rank never comes back here with an exception: fork() ends it instead.)
            try:
                job = self.handle(c, kind, decode_fields(body))
            except MalformedRequest as e:
                self.drop(c, str(e))
                return None
            if job is not None:
                return job
        return None

    def hello(self, fields):
        if self.stopping:
            return "the warm server is stopping"
        if "env" in fields:
            want = start_vars(dict(kv.split("=", 1) for kv in text_field(fields, "env").split("\0") if "=" in kv))
            have = start_vars(self.env_at_start)
            for k in sorted(set(want) | set(have)):
                if want.get(k) != have.get(k):
                    return (f"the warm server was started with {k}={have.get(k, '<unset>')!r} but this launch has "
                            f"{k}={want.get(k, '<unset>')!r}, which is read only when the interpreter starts "
                            "or a preloaded module is imported")
        differs = attribute_difference(self.attributes, fields)
        if differs:
            return (f"{differs}; a rank forked from the server would have the server's (start the "
                    "server from where you launch, or start cold: --cold, AIRHOST_WARM=0)")
        changed = self.changed_source()
        if changed:
            self.stopping = True  # stale: serve no one again; exit once our ranks are done
            self.retire()
            return f"{changed} changed since the warm server preloaded it; the server retires (start a new one)"
        return unsafe_reason(self.allowed_native)

    def handle(self, c, kind, fields):
        if kind == HELLO:
            why = self.hello(fields)
            if why:
                c.send(REFUSED, {"reason": why})
            else:
                c.send(READY, {
                    "pid": os.getpid(),
                    "python": sys.executable,
                    "version": _airhost_rank.version,
                    "preload": self.preload_spec,
                    "modules": ",".join(self.modules),
                    "uptime": f"{time.time() - self.started:.0f}",
                    "ranks": len(self.children),
                })
            return None
        if kind == STOP:
            self.stopping = True
            self.retire()
            c.send(STOPPING, {"pid": os.getpid(), "ranks": len(self.children)})
            return None
        if kind == START:
            rank = text_field(fields, "rank", "?")
            text_field(fields, "argv"), text_field(fields, "env"), text_field(fields, "cwd", "")  # before any fork
            if len(c.fds) < 3:
                c.send(START_FAILED, {"rank": rank, "reason": "the start request came without its 3 descriptors"})
                return None
            fds, c.fds = c.fds[:3], c.fds[3:]
            why = "" if not self.stopping else "the warm server is stopping"
            why = why or unsafe_reason(self.allowed_native)
            if why:
                for fd in fds:
                    os.close(fd)
                c.send(START_FAILED, {"rank": rank, "reason": why})
                return None
            return self.fork(c, rank, fields, fds)
        return None  # kinds newer than this server: skipped

    def fork(self, c, rank, fields, fds):
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                return self.become_rank(fields, fds, ready_w)
            except BaseException:  # never back into the server's loop as a second server
                traceback.print_exc()
                os._exit(1)
        os.close(ready_w)
        for fd in fds:
            os.close(fd)
        # The child answers once it leads its own session: a teardown signal sent to its
        # group right after STARTED must reach it.
        ok = os.read(ready_r, 1)
        os.close(ready_r)
        self.children[pid] = c
        c.ranks.add(pid)
        if ok == b"1":
            c.send(STARTED, {"rank": rank, "pid": pid})
        else:
            c.send(STARTED, {"rank": rank, "pid": pid})  # it died at once; EXITED follows
        return None

    def become_rank(self, fields, fds, ready_w):
        os.setsid()
        _airhost_rank.die_with_parent(os.getppid())  # the server; the host's guard covers the host
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # A cold rank starts with every disposition at its default (libuv's spawn resets them)
        # and Python's KeyboardInterrupt on SIGINT; a warm one must too, even when the server
        # inherited SIGINT ignored (a caller started with `&` or nohup): the host's teardown
        # and cancel(SIGINT) reach the rank by SIGINT first.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # The server's own descriptors go first: one of them may be fd 3, which dup2 reuses.
        self.sel.close()
        for c in self.conns.values():
            for fd in c.fds:
                os.close(fd)
        for s in [self.listener, self.wake_r, self.wake_w, *self.conns]:
            s.close()
        out, err, ctl = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        # Moved above 3 first, so that no dup2 below overwrites a source still to be copied.
        out, err, ctl, devnull = (fcntl.fcntl(fd, fcntl.F_DUPFD, 4) if fd <= 3 else fd for fd in (out, err, ctl, devnull))
        for fd, target in ((devnull, 0), (out, 1), (err, 2), (ctl, 3)):
            os.dup2(fd, target)  # dup2 clears FD_CLOEXEC on the target
            os.close(fd)
        os.write(ready_w, b"1")
        os.close(ready_w)
        return {
            "argv": fields["argv"].decode().split("\0"),
            "env": fields["env"].decode().split("\0"),
            "cwd": fields.get("cwd", b"").decode(),
        }


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.fds = []
        self.ranks = set()

    def send(self, kind, fields):
        try:
            self.sock.sendall(encode(kind, fields))
        except OSError:
            pass  # the host is gone; its EOF is handled by the loop


def serve(sock_path, preload, parent_pid):
    # With a parent pid (the Python API's caller), the serve loop leaves within a second of
    # the parent's end. Not PR_SET_PDEATHSIG: it follows the thread that started us, which
    # may end long before the process does.
    parent = int(parent_pid or 0)
    server = Server(sock_path, preload, parent)
    try:
        server.preload()
    except SystemExit as e:
        print(e.code, file=sys.stderr, flush=True)
        return 3
    return server.serve()


# ---- in the forked rank -----------------------------------------------------------------

SIGINT_EXIT = -2  # airhost-rank re-raises SIGINT after finalizing, as python does


def fresh_process_state():
    """What a fresh interpreter draws from the OS at start, drawn again in this forked rank:
    without it every rank of every warm run would continue the server's random streams
    (unseeded torch.rand, augmentation, dropout masks, initial weights all identical).
    Seeding (torch.manual_seed(0) and friends) comes later, in the user's code, and wins."""
    import random

    # CPython's at-fork hook already reseeds random's global instance; done again so that the
    # promise does not rest on how the fork was made.
    random.seed()
    for rng in list(_entropy_seeded_randoms):
        rng.seed()  # a random.Random a preloaded module made without a seed, as cold would give
    # numpy's global generator is made from the OS when numpy.random is imported. torch
    # imports numpy but not numpy.random: then the rank makes its own, fresh, if it uses it
    # (and seeding here would import numpy.random in every rank: 10 ms and 6 MB of copied
    # pages for nothing).
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        # A cold rank's CPU default generator is created at `import torch` from /dev/urandom;
        # its seed() draws a new one the same way (initial_seed() then differs per rank).
        # Not torch.seed(): that also queues torch.cuda.manual_seed_all(cpu seed) for CUDA's
        # lazy init, giving every GPU the CPU's seed, where a cold rank seeds each device's
        # generator from the OS when CUDA creates it. The server never initialises CUDA (it
        # refuses to fork if it has), so CUDA's generators are created, fresh, in the rank.
        try:
            torch.default_generator.seed()
        except Exception:
            pass
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        # Drawn from os.urandom when multiprocessing is imported (torch imports it): a fresh
        # interpreter has its own, and a Listener/Manager authenticates with it.
        try:
            mp.current_process().authkey = os.urandom(32)
        except Exception:
            pass
    # The time zone is read from TZ when `time` is imported; a launch's TZ may differ.
    time.tzset()


# random.Random instances that preloaded modules created without a seed (from the OS, in a
# fresh interpreter). Filled by Server.preload, reseeded in each forked rank; instances the
# module seeded with a value keep it, as they would cold.
_entropy_seeded_randoms = ()


def _track_entropy_seeded_randoms():
    """Wraps random.Random.seed while the preload runs; returns the function that undoes it."""
    global _entropy_seeded_randoms
    import random
    import weakref

    _entropy_seeded_randoms = weakref.WeakSet()
    original = random.Random.seed

    def seed(self, a=None, version=2):
        original(self, a, version)
        try:
            if a is None:
                _entropy_seeded_randoms.add(self)
            else:
                _entropy_seeded_randoms.discard(self)
        except TypeError:
            pass  # a subclass with __slots__ and no __weakref__: not tracked

    random.Random.seed = seed
    return lambda: setattr(random.Random, "seed", original)


def _parse_argv(argv):
    opts = {"kind": "", "target": "", "function": "", "python": "", "result-format": "pickle"}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        opts[a[2:]] = argv[i + 1]
        i += 2
    return opts, argv[i:]


def _strip_own_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == "<airhost warm>":
        tb = tb.tb_next
    return tb


def run_child(job):
    """Runs the rank's entry exactly as a cold airhost-rank would; returns its exit code."""
    _airhost_rank.clearenv()
    os.environ.clear()
    for kv in job["env"]:
        if "=" in kv:
            k, v = kv.split("=", 1)
            os.environ[k] = v
    if job["cwd"]:
        os.chdir(job["cwd"])
    _airhost_rank.set_control_fd(int(os.environ.get("AIRHOST_CONTROL_FD", "3")))
    fresh_process_state()
    bootstrap = sys.modules["_airhost_bootstrap"]
    bootstrap.install()

    opts, args = _parse_argv(job["argv"])
    kind, target = opts["kind"], opts["target"]
    if kind in ("function-script", "function-module", "pickled"):
        sys.argv = [("-c" if kind == "pickled" else target), *args]
        sys.orig_argv = list(sys.argv)
        # A function rank ends as a cold one does (runtime/interpreter.cpp): exit_quickly, then
        # _exit, not a full finalization that tears torch down for a second or more of CPU
        # while the caller waits for the run to end. A script ends as `python` would.
        job["quick_exit"] = True
        return bootstrap.run_function(kind, target, opts["function"], opts["result-format"])

    import __main__

    try:
        if kind == "script":
            sys.argv = [target, *args]
            sys.orig_argv = list(sys.argv)
            filename = os.path.abspath(target)  # python makes __main__.__file__ absolute (3.9+)
            if not sys.flags.safe_path:
                sys.path.insert(0, os.path.dirname(os.path.realpath(filename)))
            with open(filename, "rb") as f:
                source = f.read()
            code = compile(source, filename, "exec", dont_inherit=True)
            __main__.__dict__["__file__"] = filename
            __main__.__dict__["__cached__"] = None
            exec(code, __main__.__dict__)
        else:  # module
            import runpy

            sys.argv = ["-m", *args]
            sys.orig_argv = list(sys.argv)
            if not sys.flags.safe_path:
                sys.path.insert(0, os.getcwd())
            runpy._run_module_as_main(target, True)
        return 0
    except SystemExit as e:
        return bootstrap.exit_status(e)
    except BaseException as e:
        tb = _strip_own_frames(e.__traceback__)
        e.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        sys.excepthook(type(e), e, tb)
        return SIGINT_EXIT if isinstance(e, KeyboardInterrupt) else 1
