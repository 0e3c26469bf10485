#include "interpreter.hpp"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bootstrap_py.hpp"

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

// Runs bootstrap.py in a module of its own and returns that module (new reference).
PyObject* load_bootstrap() {
  PyObject* module = PyImport_AddModule("_airhost_bootstrap");  // borrowed
  if (!module) return nullptr;
  PyObject* globals = PyModule_GetDict(module);  // borrowed
  if (PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) < 0) return nullptr;
  PyObject* code = Py_CompileString(kBootstrapSource, "<airhost bootstrap>", Py_file_input);
  if (!code) return nullptr;
  PyObject* rv = PyEval_EvalCode(code, globals, globals);
  Py_DECREF(code);
  if (!rv) return nullptr;
  Py_DECREF(rv);
  PyObject* install = PyObject_CallMethod(module, "install", nullptr);
  if (!install) return nullptr;
  Py_DECREF(install);
  Py_INCREF(module);
  return module;
}

}  // namespace

int run_interpreter(const RankArgs& args) {
  ConfigGuard config;
  config->parse_argv = 0;     // our argv is the script's, never python's own options
  config->faulthandler = 1;   // a segfault in a rank leaves its Python stack in the log

  PyStatus status;
  if (!args.python.empty()) {
    // getpath derives prefix, venv (pyvenv.cfg) and site-packages from the executable, so
    // ranks see exactly the packages of the interpreter airhost was told to use.
    status = PyConfig_SetBytesString(config.get(), &config->program_name, args.python.c_str());
    if (PyStatus_Exception(status)) return fail(status);
    status = PyConfig_SetBytesString(config.get(), &config->executable, args.python.c_str());
    if (PyStatus_Exception(status)) return fail(status);
  }

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
  // The result is with the host; the run, and the caller with it, waits only for this process
  // to end. bootstrap.exit_quickly does what of Python's exit a program can see; the rest of
  // Py_FinalizeEx (tearing torch down: a second or more per rank) is skipped, as
  // multiprocessing does for its workers, unless AIRHOST_RANK_FINALIZE=1.
  const char* full = std::getenv("AIRHOST_RANK_FINALIZE");
  if (!(full && std::string(full) == "1")) {
    PyObject* last = PyObject_CallMethod(bootstrap, "exit_quickly", "i", code);
    if (last) {
      code = static_cast<int>(PyLong_AsLong(last));
      Py_DECREF(last);
      std::fflush(nullptr);  // C stdio of extensions (NCCL's log, say), as exit() would
      _exit(code);
    }
    PyErr_Print();  // could not even do that: finalize fully below
  }
  Py_DECREF(bootstrap);
  if (Py_FinalizeEx() < 0 && code == 0) code = 120;  // what python does when flushing fails
  return code;
}

}  // namespace airhost::rank
