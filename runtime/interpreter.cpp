#include "interpreter.hpp"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bootstrap_py.hpp"
#include "warm_py.hpp"

namespace airhost::rank {
namespace {

// PyConfig owns its strings; this guard makes sure every exit path clears it.
class ConfigGuard {
 public:
  ConfigGuard() { PyConfig_InitPythonConfig(&config_); }
  ~ConfigGuard() { PyConfig_Clear(&config_); }
  ConfigGuard(const ConfigGuard&) = delete;
  ConfigGuard& operator=(const ConfigGuard&) = delete;
  PyConfig* operator->() { return &config_; }
  PyConfig* get() { return &config_; }

 private:
  PyConfig config_;
};

// CPython's own status message goes to stderr as python would print it; a rank that cannot
// start its interpreter exits 1 with that message in its log.
int fail(const PyStatus& status) {
  if (PyStatus_IsExit(status)) return status.exitcode;
  std::fprintf(stderr, "airhost-rank: cannot start Python: %s%s%s\n",
               status.func ? status.func : "", status.func ? ": " : "",
               status.err_msg ? status.err_msg : "unknown error");
  return 1;
}

// Runs `source` in a module of its own named `name` (new reference).
PyObject* load_module(const char* name, const char* source, const char* filename) {
  PyObject* module = PyImport_AddModule(name);  // borrowed
  if (!module) return nullptr;
  PyObject* globals = PyModule_GetDict(module);  // borrowed
  if (PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) < 0) return nullptr;
  PyObject* code = Py_CompileString(source, filename, Py_file_input);
  if (!code) return nullptr;
  PyObject* rv = PyEval_EvalCode(code, globals, globals);
  Py_DECREF(code);
  if (!rv) return nullptr;
  Py_DECREF(rv);
  Py_INCREF(module);
  return module;
}

// Runs bootstrap.py in a module of its own and returns that module (new reference).
PyObject* load_bootstrap() {
  PyObject* module = load_module("_airhost_bootstrap", kBootstrapSource, "<airhost bootstrap>");
  if (!module) return nullptr;
  PyObject* install = PyObject_CallMethod(module, "install", nullptr);
  if (!install) {
    Py_DECREF(module);
    return nullptr;
  }
  Py_DECREF(install);
  return module;
}

// The interpreter's configuration, the same for a cold rank and the warm server.
PyStatus set_python(ConfigGuard& config, const std::string& python) {
  config->parse_argv = 0;     // our argv is the script's, never python's own options
  config->faulthandler = 1;   // a segfault in a rank leaves its Python stack in the log
  if (python.empty()) return PyStatus_Ok();
  // getpath derives prefix, venv (pyvenv.cfg) and site-packages from the executable, so
  // ranks see exactly the packages of the interpreter airhost was told to use.
  PyStatus status = PyConfig_SetBytesString(config.get(), &config->program_name, python.c_str());
  if (PyStatus_Exception(status)) return status;
  return PyConfig_SetBytesString(config.get(), &config->executable, python.c_str());
}

// The end of a function rank, cold or forked warm. The result is with the host; the run, and
// the caller with it, waits only for this process to end. bootstrap.exit_quickly does what of
// Python's exit a program can see; the rest of Py_FinalizeEx (tearing torch down: a second or
// more per rank) is skipped, as multiprocessing does for its workers, unless
// AIRHOST_RANK_FINALIZE=1. Returns (to finalize fully) only then, or if even that failed.
void exit_function_rank(PyObject* bootstrap, int code) {
  const char* full = std::getenv("AIRHOST_RANK_FINALIZE");
  if (full && std::string(full) == "1") return;
  PyObject* last = PyObject_CallMethod(bootstrap, "exit_quickly", "i", code);
  if (last) {
    code = static_cast<int>(PyLong_AsLong(last));
    Py_DECREF(last);
    std::fflush(nullptr);  // C stdio of extensions (NCCL's log, say), as exit() would
    _exit(code);
  }
  PyErr_Print();  // could not even do that: finalize fully
}

}  // namespace

int run_interpreter(const RankArgs& args) {
  ConfigGuard config;
  PyStatus status = set_python(config, args.python);
  if (PyStatus_Exception(status)) return fail(status);

  std::vector<std::string> argv;
  const bool run_main = args.kind == "script" || args.kind == "module";
  if (args.kind == "script") {
    argv.push_back(args.target);
    status = PyConfig_SetBytesString(config.get(), &config->run_filename, args.target.c_str());
  } else if (args.kind == "module") {
    argv.push_back("-m");  // runpy replaces it with the module's path, as python -m does
    status = PyConfig_SetBytesString(config.get(), &config->run_module, args.target.c_str());
  } else {
    argv.push_back(args.kind == "pickled" ? "-c" : args.target);
  }
  if (PyStatus_Exception(status)) return fail(status);
  argv.insert(argv.end(), args.args.begin(), args.args.end());

  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  status = PyConfig_SetBytesArgv(config.get(), static_cast<Py_ssize_t>(raw.size()), raw.data());
  if (PyStatus_Exception(status)) return fail(status);

  status = Py_InitializeFromConfig(config.get());
  if (PyStatus_Exception(status)) return fail(status);

  PyObject* bootstrap = load_bootstrap();
  if (!bootstrap) {
    PyErr_Print();
    Py_FinalizeEx();
    return 1;
  }

  if (run_main) {
    Py_DECREF(bootstrap);
    // Py_RunMain runs config.run_filename / run_module exactly as the python command does
    // (sys.path[0], __main__, SystemExit, KeyboardInterrupt), then finalizes.
    return Py_RunMain();
  }

  int code = 1;
  PyObject* rv = PyObject_CallMethod(bootstrap, "run_function", "ssss", args.kind.c_str(),
                                     args.target.c_str(), args.function.c_str(), args.result_format.c_str());
  if (rv) {
    code = static_cast<int>(PyLong_AsLong(rv));
    Py_DECREF(rv);
  } else {
    PyErr_Print();
  }
  exit_function_rank(bootstrap, code);  // returns only with AIRHOST_RANK_FINALIZE=1
  Py_DECREF(bootstrap);
  if (Py_FinalizeEx() < 0 && code == 0) code = 120;  // what python does when flushing fails
  return code;
}

int run_warm_server(const WarmArgs& args) {
  ConfigGuard config;
  PyStatus status = set_python(config, args.python);
  if (PyStatus_Exception(status)) return fail(status);
  char name[] = "airhost-warm";
  char* argv[] = {name};
  status = PyConfig_SetBytesArgv(config.get(), 1, argv);
  if (PyStatus_Exception(status)) return fail(status);
  status = Py_InitializeFromConfig(config.get());
  if (PyStatus_Exception(status)) return fail(status);

  // bootstrap.py is loaded now and installed in each forked rank, once its environment is set.
  PyObject* bootstrap = load_module("_airhost_bootstrap", kBootstrapSource, "<airhost bootstrap>");
  PyObject* warm = bootstrap ? load_module("_airhost_warm", kWarmSource, "<airhost warm>") : nullptr;
  Py_XDECREF(bootstrap);
  PyObject* job = warm ? PyObject_CallMethod(warm, "serve", "sss", args.socket.c_str(), args.preload.c_str(),
                                             args.parent_pid.c_str())
                       : nullptr;
  if (!job) {
    PyErr_Print();
    Py_XDECREF(warm);
    Py_FinalizeEx();
    return 1;
  }
  int code = 0;
  if (PyLong_Check(job)) {  // the server is done
    code = static_cast<int>(PyLong_AsLong(job));
    Py_DECREF(job);
    Py_DECREF(warm);
    Py_FinalizeEx();
    return code;
  }
  // A forked rank: serve()'s frames are gone; the entry runs from a clean stack.
  PyObject* rv = PyObject_CallMethod(warm, "run_child", "O", job);
  // run_child marks a function rank (job["quick_exit"]): it ends as a cold one does.
  const bool function_rank = PyDict_Check(job) && PyDict_GetItemString(job, "quick_exit") == Py_True;
  Py_DECREF(job);
  Py_DECREF(warm);
  if (rv) {
    code = static_cast<int>(PyLong_AsLong(rv));
    Py_DECREF(rv);
  } else {
    PyErr_Print();
    code = 1;
  }
  if (function_rank) {
    PyObject* bootstrap = PyImport_ImportModule("_airhost_bootstrap");
    if (bootstrap) {
      exit_function_rank(bootstrap, code);
      Py_DECREF(bootstrap);
    } else {
      PyErr_Clear();
    }
  }
  const bool sigint = code == -2;
  if (sigint) code = 130;
  if (Py_FinalizeEx() < 0 && code == 0) code = 120;  // what python does when flushing fails
  if (sigint) {
    // As Py_RunMain does for an unhandled KeyboardInterrupt: die of SIGINT.
    ::signal(SIGINT, SIG_DFL);
    ::kill(::getpid(), SIGINT);
  }
  return code;
}

}  // namespace airhost::rank
