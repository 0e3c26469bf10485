// airhost/exit_code.hpp — the exit-code contract of `airhost` and of RunReport::exit_code.
#pragma once

namespace airhost {

// Every exit status airhost itself decides, in one place. When a rank fails, the run
// exits with that rank's own code instead (the earliest failure), or 128+signal when the
// rank died of a signal — so `airhost` composes with shells exactly like the script would.
enum class ExitCode : int {
  ok = 0,               // every rank exited 0
  generic_failure = 1,  // a failure airhost cannot attribute to a rank code (e.g. spawn failed)
  usage = 2,            // bad command line, config file or launch spec; nothing was started
  no_accelerator = 3,   // `airhost doctor`: the node has no usable GPU
  preflight_failed = 4, // `--preflight` refused the node, or `airhost doctor` found a failing check
  timeout = 124,        // the run outlived its timeout (same code as coreutils `timeout`)
  node_lost = 138,      // several nodes: another node failed, was stopped or lost (or never
                        // joined), so this node's ranks were stopped; the message names it.
                        // The failing node itself exits with its own rank's code. 138 is the
                        // code Kubeflow's training operator retries as "user-defined
                        // retryable" under restartPolicy: ExitCode (128 + SIGUSR1, a signal
                        // airhost never sends): a healthy node that only followed another
                        // one's loss must not fail the job for good. A rank killed by SIGUSR1
                        // also gives 138, with another message.
  hangup = 129,         // host got SIGHUP (128 + 1)
  interrupted = 130,    // host got SIGINT / Ctrl-C, or a cancel() (128 + 2)
  terminated = 143,     // host got SIGTERM (128 + 15)
};

constexpr int to_int(ExitCode c) noexcept { return static_cast<int>(c); }

// The shell's convention for a process killed by signal `sig`.
constexpr int exit_code_for_signal(int sig) noexcept { return 128 + sig; }

}  // namespace airhost
