// airhost/launcher.hpp — run a LaunchSpec and supervise its ranks until they are all gone.
#pragma once

#include <memory>
#include <string>

#include "airhost/callbacks.hpp"
#include "airhost/launch.hpp"
#include "airhost/report.hpp"

namespace airhost {

// Runs one launch. Thread-safe only through cancel(); run() blocks until every rank is
// reaped, the logs are flushed and run.json is written. One Launcher runs once.
class Launcher {
 public:
  explicit Launcher(LaunchSpec spec, Callbacks callbacks = {});
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Throws LaunchError if run() would refuse the spec; starts nothing. For callers that
  // prepare more (an MLflow run, a GPU lease) only once the spec is known to be good.
  void check() const;

  // Validates the spec (throws LaunchError), starts every rank, supervises them.
  // Never calls exit(); returns the report whatever the ranks did.
  RunReport run();

  // Stops a running launch as if the host got `signal` (SIGINT by default): the ranks get
  // it, then SIGKILL after the grace period. Safe from any thread and from a signal-free
  // context; a no-op before run() starts or after it returns.
  void cancel(int signal = 2) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airhost
