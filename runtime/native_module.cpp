// native_module.cpp — `airhost._native`: the Python API's door to libairhost.
//
// A launch runs on a thread of its own (the Launcher blocks until every rank is reaped);
// rank output is queued and handed to the caller's thread by poll(), so that a notebook
// prints it in the cell that started the run, and Ctrl-C reaches the caller's thread.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <signal.h>
#include <sys/mman.h>

#include <cstdint>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include "gpu/accelerator_types.hpp"
#include "gpu/accelerators.hpp"
#include "airhost/airhost.hpp"
#include "base/errors.hpp"
#include "launch/run/run_dir.hpp"

namespace py = pybind11;
using namespace airhost;

namespace {

template <typename T>
T get(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return d[key].cast<T>();
}

LaunchSpec spec_from_dict(const py::dict& d) {
  LaunchSpec spec;
  const auto kind = get<std::string>(d, "kind", "pickled");
  if (kind == "script") spec.entry.kind = Entry::Kind::script;
  else if (kind == "module") spec.entry.kind = Entry::Kind::module;
  else if (kind == "function") spec.entry.kind = Entry::Kind::function;
  else if (kind == "pickled") spec.entry.kind = Entry::Kind::pickled;
  else throw py::value_error("unknown entry kind '" + kind + "'");
  spec.entry.target = get<std::string>(d, "target", "");
  spec.entry.function = get<std::string>(d, "function", "");
  spec.entry.module_target = get<bool>(d, "module_target", false);
  spec.entry.args = get<std::vector<std::string>>(d, "args", {});
  spec.nprocs = get<int>(d, "nprocs", 1);
  spec.devices = get<std::vector<int>>(d, "devices", {});
  spec.python = get<std::string>(d, "python", "");
  spec.env = get<std::map<std::string, std::string>>(d, "env", {});
  spec.inherit_env = get<bool>(d, "inherit_env", true);
  spec.timeout = std::chrono::seconds(get<long long>(d, "timeout", 0));
  spec.grace = std::chrono::milliseconds(static_cast<long long>(get<double>(d, "grace", 10.0) * 1000));
  spec.hang_timeout = std::chrono::milliseconds(static_cast<long long>(get<double>(d, "hang_timeout", 1800.0) * 1000));
  spec.stop_on_hang = get<bool>(d, "stop_on_hang", false);
  spec.run_id = get<std::string>(d, "run_id", "");
  spec.run_dir = get<std::string>(d, "run_dir", "");
  spec.master_addr = get<std::string>(d, "master_addr", "127.0.0.1");
  spec.master_port = get<int>(d, "master_port", 0);
  spec.max_restarts = get<int>(d, "max_restarts", 0);
  spec.working_dir = get<std::string>(d, "working_dir", "");
  spec.rank_binary = get<std::string>(d, "rank_binary", "");
  spec.warm_socket = get<std::string>(d, "warm_socket", "");
  spec.output.forward = get<bool>(d, "forward", false);
  spec.output.prefix = get<bool>(d, "prefix", true);
  spec.output.terminal_columns = get<int>(d, "terminal_columns", 0);
  spec.output.terminal_lines = get<int>(d, "terminal_lines", 0);
  spec.handle_signals = false;  // the caller's signals stay the caller's: Ctrl-C → cancel()
  spec.keep_result_descriptors = true;  // mapped by ResultMapping below, never copied here
  return spec;
}

// A rank's result handed over by descriptor (airhost::ResultBlob), mapped copy-on-write: the
// Python API unpickles it with buffers that point into the mapping, so tensors and arrays
// are never copied, and writing to them copies only the pages written. The mapping keeps the
// memory alive, not a descriptor: it goes when the last object built on it does.
class ResultMapping {
 public:
  explicit ResultMapping(const ResultBlob& blob) : size_(blob.size()), shared_memory_(blob.in_shared_memory()) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, blob.fd(), 0);
    if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "cannot map a rank's result");
    data_ = p;
  }
  ~ResultMapping() { ::munmap(data_, size_); }
  ResultMapping(const ResultMapping&) = delete;
  ResultMapping& operator=(const ResultMapping&) = delete;

  py::buffer_info buffer() {
    return py::buffer_info(data_, 1, py::format_descriptor<unsigned char>::format(), 1,
                           {static_cast<py::ssize_t>(size_)}, {static_cast<py::ssize_t>(1)}, false);
  }
  std::uint64_t size() const { return size_; }
  bool in_shared_memory() const { return shared_memory_; }

 private:
  void* data_ = nullptr;
  std::uint64_t size_;
  bool shared_memory_;
};

py::dict report_to_dict(const RunReport& r) {
  py::dict d;
  d["outcome"] = to_string(r.outcome);
  d["exit_code"] = r.exit_code;
  d["root_cause"] = r.root_cause;
  d["interrupt_signal"] = r.interrupt_signal;
  d["run_id"] = r.run_id;
  d["run_dir"] = r.run_dir;
  d["message"] = r.message;
  d["hang"] = r.hang;
  d["wall_seconds"] = r.wall_seconds;
  d["restarts"] = r.restarts;
  d["failed_attempts"] = r.failed_attempts;
  py::list attempts;
  for (const auto& a : r.attempts) {
    py::dict ad;
    ad["attempt"] = a.attempt;
    ad["nnodes"] = a.nnodes;
    ad["node_rank"] = a.node_rank;
    ad["nodes"] = a.nodes;
    ad["began"] = a.began;
    attempts.append(ad);
  }
  d["attempts"] = attempts;
  d["incomplete_logs"] = r.incomplete_logs;
  d["warm"] = r.warm;
  d["start_mode"] = r.start_mode;
  py::list ranks;
  for (const auto& k : r.ranks) {
    py::dict rd;
    rd["rank"] = k.rank;
    rd["local_rank"] = k.local_rank;
    rd["pid"] = k.pid;
    rd["state"] = to_string(k.state);
    rd["exit_code"] = k.exit_code;
    rd["signal"] = k.term_signal;
    if (k.result_blob)
      rd["result"] = py::cast(std::make_unique<ResultMapping>(*k.result_blob));
    else
      rd["result"] = k.result ? py::object(py::bytes(*k.result)) : py::object(py::none());
    if (k.error) {
      py::dict e;
      e["type"] = k.error->type;
      e["message"] = k.error->message;
      e["traceback"] = k.error->traceback;
      e["pickled"] = py::bytes(k.error->pickled);
      e["time"] = k.error->time;
      rd["error"] = e;
    } else {
      rd["error"] = py::none();
    }
    rd["stdout_log"] = k.stdout_log;
    rd["stderr_log"] = k.stderr_log;
    ranks.append(rd);
  }
  d["ranks"] = ranks;
  return d;
}

// Bytes for the caller's stdout (1) or stderr (2), ready to write (Callbacks::on_console).
struct Piece {
  int stream;
  std::string bytes;
};

// One launch on its own thread. The thread that spawns the ranks must live until they
// are reaped: PR_SET_PDEATHSIG fires when the spawning *thread* ends.
class Run {
 public:
  explicit Run(const py::dict& spec_dict) {
    LaunchSpec spec = spec_from_dict(spec_dict);
    Callbacks cb;
    // What the console shows, as it comes (progress bars and partial lines included): the
    // caller writes it to sys.stdout and sys.stderr as it is.
    // Bounded: a caller that stops reading (its thread blocked writing to a stdout nobody
    // reads) must not make this queue, and the caller's memory, grow without end. Past the
    // cap the bytes are skipped, counted, and said at the next poll; the logs have them all.
    logs_ = spec.run_dir + "/logs";
    cb.on_console = [this](Stream s, std::string_view bytes) {
      std::lock_guard lock(mutex_);
      if (queued_ > 0 && queued_ + bytes.size() > kMaxQueued) {
        skipped_ += bytes.size();
        return;
      }
      queued_ += bytes.size();
      if (!bytes.empty()) last_newline_ = bytes.back() == '\n';
      pieces_.push_back({static_cast<int>(s), std::string(bytes)});
      cv_.notify_all();
    };
    // A restart reaches the caller's stderr among the rank output, as a line of its own (every
    // rank's stream ended with the failed attempt, so no rank line is open).
    cb.on_restart = [this](const RestartEvent& e) {
      std::lock_guard lock(mutex_);
      pieces_.push_back({static_cast<int>(Stream::err),
                         "airhost: " + e.reason + "; restarting every rank (restart " + std::to_string(e.restart) +
                             " of " + std::to_string(e.max_restarts) + ")\n"});
      cv_.notify_all();
    };
    // A warm server that was there but refused this launch says why the ranks start cold.
    cb.on_start_mode = [this](bool warm, const std::string& line) {
      if (warm || line.find("no warm server running") != std::string::npos) return;
      std::lock_guard lock(mutex_);
      pieces_.push_back({static_cast<int>(Stream::err), "airhost: " + line + "\n"});
      cv_.notify_all();
    };
    // What the CLI says on stderr (a hang report, where the other ranks were when one failed)
    // reaches the caller's stderr too, a line of its own among the rank output.
    cb.on_host_line = [this](const std::string& line) {
      std::lock_guard lock(mutex_);
      pieces_.push_back({static_cast<int>(Stream::err), (last_newline_ ? "" : "\n") + ("airhost: " + line + "\n")});
      last_newline_ = true;
      cv_.notify_all();
    };
    launcher_ = std::make_unique<Launcher>(std::move(spec), std::move(cb));
    thread_ = std::thread([this] {
      RunReport report;
      std::string error;
      try {
        report = launcher_->run();
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard lock(mutex_);
      report_ = std::move(report);
      launch_error_ = std::move(error);
      done_ = true;
      cv_.notify_all();
    });
  }

  ~Run() {
    if (thread_.joinable()) {
      launcher_->cancel(SIGKILL);
      py::gil_scoped_release release;
      thread_.join();
    }
  }

  // Waits up to `timeout` seconds for output or the end; returns (done, [(stream, bytes)]).
  py::tuple poll(double timeout) {
    std::deque<Piece> batch;
    bool done;
    {
      py::gil_scoped_release release;
      std::unique_lock lock(mutex_);
      cv_.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return done_ || !pieces_.empty(); });
      batch.swap(pieces_);
      queued_ = 0;
      if (skipped_) {
        char mib[32];
        std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(skipped_) / (1 << 20));
        batch.push_back({static_cast<int>(Stream::err),
                         std::string(last_newline_ ? "" : "\n") + "airhost: " + mib +
                             " MiB of the ranks' output was skipped here: it was not read in time (every byte is in "
                             "the logs: " + logs_ + ")\n"});
        skipped_ = 0;
        last_newline_ = true;
      }
      done = done_;
    }
    py::list out;
    for (auto& p : batch) out.append(py::make_tuple(p.stream, py::bytes(p.bytes)));
    if (done && thread_.joinable()) {
      py::gil_scoped_release release;
      thread_.join();
    }
    return py::make_tuple(done, out);
  }

  void cancel(int sig) { launcher_->cancel(sig); }

  // The first call maps the results handed over by descriptor and lets go of the
  // descriptors; later calls return the same dict.
  py::object report() {
    std::lock_guard lock(mutex_);
    if (!done_) throw std::runtime_error("the run is still going; poll() until it is done");
    if (!launch_error_.empty()) return py::str(launch_error_);
    if (report_dict_.is_none()) {
      report_dict_ = report_to_dict(report_);
      for (auto& r : report_.ranks) r.result_blob.reset();
    }
    return report_dict_;
  }

 private:
  std::unique_ptr<Launcher> launcher_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Piece> pieces_;
  static constexpr std::size_t kMaxQueued = 8u << 20;
  std::size_t queued_ = 0;      // bytes in pieces_
  std::uint64_t skipped_ = 0;   // since the last poll
  bool last_newline_ = true;    // the last byte queued ended a line
  std::string logs_;
  bool done_ = false;
  RunReport report_;
  py::object report_dict_ = py::none();
  std::string launch_error_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "libairhost bindings for the airhost Python API (private).";
  m.attr("__version__") = version();

  py::class_<Run>(m, "Run")
      .def(py::init<const py::dict&>(), py::arg("spec"))
      .def("poll", &Run::poll, py::arg("timeout"))
      .def("cancel", &Run::cancel, py::arg("signal") = SIGINT)
      .def("report", &Run::report);

  py::class_<ResultMapping>(m, "ResultMapping", py::buffer_protocol(),
                            "A rank's result in shared memory or an unnamed file, mapped copy-on-write.")
      .def_buffer(&ResultMapping::buffer)
      .def_property_readonly("size", &ResultMapping::size)
      .def_property_readonly("in_shared_memory", &ResultMapping::in_shared_memory);

  m.def("make_run_id", &detail::make_run_id);
  m.def("default_runs_root", &default_runs_root);

  m.def("detect_accelerators", [] {
    const auto inv = detail::detect_accelerators();
    py::dict d;
    d["nvml_loaded"] = inv.nvml_loaded;
    d["nvml_error"] = inv.nvml_error;
    d["driver_version"] = inv.driver_version;
    d["node_gpu_count"] = inv.node_gpu_count;
    py::list gpus;
    for (const auto& g : inv.gpus) {
      py::dict gd;
      gd["index"] = g.index;
      gd["name"] = g.name;
      gd["uuid"] = g.uuid;
      gd["memory_total"] = g.memory_total;
      gpus.append(gd);
    }
    d["gpus"] = gpus;
    return d;
  });

  m.def("load_accelerator_types", [](const std::string& path) {
    py::list out;
    try {
      for (const auto& t : detail::load_accelerator_types(path)) {
        py::dict d;
        d["name"] = t.name;
        d["gpu"] = t.gpu;
        d["count"] = t.count;
        d["match"] = t.match;
        out.append(d);
      }
    } catch (const detail::ConfigError& e) {
      throw py::value_error(e.what());
    }
    return out;
  });

  m.def("gpu_model_of", [](const std::string& path, const std::string& name) -> py::object {
    auto model = detail::gpu_model_of(detail::load_accelerator_types(path), name);
    return model ? py::object(py::str(*model)) : py::object(py::none());
  });
}
