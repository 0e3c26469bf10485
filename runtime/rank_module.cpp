// rank_module.cpp — `_airhost_rank`, the embedded module a rank's Python talks to the host with.
#include <pybind11/embed.h>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

#include "base/fault_guard.hpp"
#include "launch/rank/frames.hpp"
#include "launch/watch/stacks.hpp"
#include "rank_module.hpp"

namespace py = pybind11;
using airhost::detail::FrameKind;

namespace airhost::rank {

int control_fd = -1;
int control_pid = -1;

namespace {

void write_all(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(control_fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "airhost control channel");
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

// Only the rank itself talks to the host: a process forked from it (a daemon, a DataLoader
// worker) shares the descriptor, and its frames would interleave with the rank's.
void require_channel() {
  if (control_fd < 0) throw std::runtime_error("this process is not an airhost rank (no control channel)");
  if (::getpid() != control_pid)
    throw std::runtime_error("this process was forked from an airhost rank; only the rank itself talks to the host");
}

// Header and payload are written separately, so a 1 GB result is never copied again.
void send(FrameKind kind, std::string_view payload) {
  require_channel();
  const std::string header = detail::encode_frame_header(static_cast<std::uint16_t>(kind), payload.size());
  py::gil_scoped_release release;  // other threads run while a big payload drains
  write_all(header);
  write_all(payload);
}

// A frame whose first byte carries `fd` (SCM_RIGHTS): the host receives the descriptor with
// the read that brings that byte, so it has it by the time the frame is complete.
void send_with_fd(FrameKind kind, std::string_view payload, int fd) {
  require_channel();
  const std::string frame = detail::encode_frame(kind, payload);
  py::gil_scoped_release release;
  detail::send_with_fds(control_fd, frame, &fd, 1, "airhost control channel");
}

std::string_view view(const py::bytes& b) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) < 0) throw py::error_already_set();
  return {data, static_cast<std::size_t>(size)};
}

// ---- stacks on demand (host/launch/watch/stacks.hpp) -----------------------------------------
//
// A thread of the rank's own, started here outside Python, waits on the control channel for
// the host's requests (each a 4-byte request number) and rewrites the dump file. No signal
// reaches the rank's threads: a thread blocked in sleep(), poll(), read() or sem_wait() is
// never cut short by being watched (#33). The thread walks CPython's thread states without
// the GIL, as faulthandler does, so a rank stuck in a C call that holds the GIL (or in a
// deadlock) answers too; the walk itself runs in a task of its own that shares the rank's
// memory (base/fault_guard.hpp): a fault while the other threads change what it reads ends
// that task, never the rank, and the rank's own SIGSEGV handlers are never touched.

using DumpThreads = const char* (*)(int fd, PyInterpreterState* interp, PyThreadState* current);
DumpThreads dump_threads = nullptr;
PyInterpreterState* stacks_interp = nullptr;
int stacks_fd = -1;
pid_t stacks_pid = -1;
unsigned long long stacks_main = 0;
unsigned stacks_seq = 0;  // the request the dump being written answers

void put(const char* s, std::size_t n) {
  while (n) {
    const ssize_t w = ::write(stacks_fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}
void put(const char* s) { put(s, std::strlen(s)); }
void put(unsigned long long v) {
  char buf[24];
  int i = sizeof buf;
  do buf[--i] = static_cast<char>('0' + v % 10); while ((v /= 10) && i > 0);
  put(buf + i, sizeof buf - static_cast<std::size_t>(i));
}

// One dump of every thread into stacks_fd; a fault in it (a thread that ran on changed what was
// being read) ends it early, and the caller writes it again.
void dump_into_file(void*) {
  ::lseek(stacks_fd, 0, SEEK_SET);
  if (::ftruncate(stacks_fd, 0) != 0) return;
  put(airhost::detail::kStacksHeader);
  put("seq="), put(stacks_seq), put(" pid="), put(static_cast<unsigned long long>(stacks_pid));
  put(" main="), put(stacks_main), put("\n");
  const char* err = dump_threads(stacks_fd, stacks_interp, nullptr);
  if (err) put("error: "), put(err), put("\n");
}

constexpr int kDumpTries = 5;
constexpr int kDumpLimitMs = 500;  // a read that takes longer is stuck (a cycle in memory being rewritten)

void answer(unsigned seq) {
  stacks_seq = seq;
  bool whole = false;
  for (int tries = 0; !whole && tries < kDumpTries; ++tries)
    whole = airhost::detail::read_guarded(dump_into_file, nullptr, kDumpLimitMs);
  if (!whole) put("error: the stacks kept changing while they were read (threads running Python); ask again\n");
  put(airhost::detail::kStacksEnd), put("seq="), put(seq), put("\n");
}

// The watcher: every signal a process gets blocked (one for the process goes to the threads that
// had it before), but not the faults a thread raises itself: blocked, those would take their
// default action instead of any handler's (faulthandler's, the fault guard's), and on kernels
// before 5.16 end the rank. Reads requests until the host closes the channel. Requests that
// came while one was answered are answered once, with the newest number.
void* watch_requests(void*) {
  sigset_t all;
  sigfillset(&all);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS}) sigdelset(&all, sig);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  unsigned char buf[64];
  std::size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(control_fd, buf + have, sizeof buf - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return nullptr;  // the host is gone (or the channel was closed)
    have += static_cast<std::size_t>(n);
    if (have < 4) continue;
    const std::size_t last = (have / 4 - 1) * 4;
    const unsigned seq = buf[last] | buf[last + 1] << 8 | buf[last + 2] << 16 | static_cast<unsigned>(buf[last + 3]) << 24;
    std::memmove(buf, buf + last + 4, have - last - 4);
    have -= last + 4;
    if (stacks_fd >= 0 && ::getpid() == stacks_pid) answer(seq);
  }
}

// Called by bootstrap.py on the main thread, with the GIL, in every rank (cold or forked warm),
// before any user code.
bool watch_stacks(const std::string& path) {
  if (control_fd < 0 || ::getpid() != control_pid) return false;  // no host to ask
  if (!dump_threads) {
    // Exported by CPython since 3.x for faulthandler; newer versions may name it anew.
    for (const char* name : {"PyUnstable_DumpTracebackThreads", "_Py_DumpTracebackThreads"})
      if ((dump_threads = reinterpret_cast<DumpThreads>(::dlsym(RTLD_DEFAULT, name)))) break;
    if (!dump_threads) return false;
  }
  if (stacks_fd >= 0 && stacks_pid == ::getpid()) return true;  // watching already
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  stacks_fd = fd;
  stacks_pid = ::getpid();
  stacks_interp = PyInterpreterState_Get();
  stacks_main = static_cast<unsigned long long>(PyThread_get_thread_ident());
  pthread_attr_t attr;
  ::pthread_attr_init(&attr);
  ::pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  ::pthread_attr_setstacksize(&attr, 256 * 1024);  // it only reads, and hands the walk to a task
  pthread_t thread;
  const int rc = ::pthread_create(&thread, &attr, watch_requests, nullptr);
  ::pthread_attr_destroy(&attr);
  if (rc != 0) return false;
  ::pthread_setname_np(thread, "airhost-stacks");
  // From here the host writes requests on the channel (host/launch/rank/frames.hpp).
  try {
    send(FrameKind::stacks_watch, {});
  } catch (const std::exception&) {
    return false;  // the host is gone: nobody will ask
  }
  return true;
}

}  // namespace
}  // namespace airhost::rank

PYBIND11_EMBEDDED_MODULE(_airhost_rank, m) {
  using namespace airhost::rank;
  m.doc() = "Private channel from an airhost rank to its host.";
  m.def("send_result", [](const py::bytes& payload) { send(FrameKind::result, view(payload)); },
        "Send the pickled return value of this rank.");
  m.def("send_result_fd",
        [](int fd, unsigned long long size, std::string where) {
          airhost::detail::Fields f{{"size", std::to_string(size)}, {"where", std::move(where)}};
          send_with_fd(FrameKind::result_fd, airhost::detail::encode_fields(f), fd);
        },
        "Hand the host the descriptor of a finished result of `size` bytes (the host gets its own copy).");
  m.def("send_error",
        [](std::string type, std::string message, std::string traceback, const py::bytes& pickled,
           std::string time) {
          airhost::detail::Fields f{{"type", std::move(type)},
                                    {"message", std::move(message)},
                                    {"traceback", std::move(traceback)},
                                    {"pickled", std::string(view(pickled))},
                                    {"time", std::move(time)}};
          send(FrameKind::error, airhost::detail::encode_fields(f));
        },
        "Send the exception this rank is dying of.");
  m.def("send_frame", [](int kind, const py::bytes& payload) {
          send(static_cast<FrameKind>(kind), view(payload));
        },
        "Send a raw frame of any kind (for extensions of the protocol).");
  m.def("connected", []() { return control_fd >= 0 && ::getpid() == control_pid; });
  m.attr("version") = AIRHOST_VERSION;
  // For the warm server (runtime/warm.py) and the ranks it forks.
  m.def("set_control_fd", [](int fd) {
          if (::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0) {  // as rank_main does
            control_fd = fd;
            control_pid = ::getpid();
          }
        },
        "Adopt `fd` as this rank's control channel.");
  m.def("watch_stacks", &watch_stacks, py::arg("path"),
        "Write this rank's Python stacks into `path` on the host's request (a thread of its own reads\n"
        "the requests on the control channel; no signal reaches the rank's threads).");
  m.def("clearenv", []() { ::clearenv(); }, "Empty the C environment (os.environ is rebuilt after).");
  m.def("die_with_parent",
        [](int parent, int sig) {
          // PDEATHSIG, then the check that closes the race where the parent died first.
          ::prctl(PR_SET_PDEATHSIG, sig);
          if (::getppid() != parent) _exit(137);
        },
        py::arg("parent"), py::arg("sig") = SIGKILL,
        "Get `sig` when the parent dies; exit now if it already has.");
}
