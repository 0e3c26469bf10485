#include "launch/procs/group_guard.hpp"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace airhost::detail {

bool GroupGuard::start(uv_loop_t* loop, const std::string& executable, const std::vector<std::string>& env) {
  // A socket, not a pipe: send() with MSG_NOSIGNAL cannot raise SIGPIPE in the host (the
  // Python API's host is the user's process) should the guard be gone.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return false;
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  char guard_flag[] = "--guard";
  char* argv[] = {const_cast<char*>(executable.c_str()), guard_flag, nullptr};
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_INHERIT_FD;
  stdio[0].data.fd = sv[1];
  stdio[1].flags = UV_IGNORE;
  stdio[2].flags = UV_INHERIT_FD;  // the host's stderr, should it ever have to say something
  stdio[2].data.fd = STDERR_FILENO;
  uv_process_options_t opts{};
  opts.file = argv[0];
  opts.args = argv;
  opts.env = envp.data();
  opts.stdio = stdio;
  opts.stdio_count = 3;
  opts.flags = UV_PROCESS_DETACHED;  // its own session: Ctrl-C and group signals pass it by
  opts.exit_cb = [](uv_process_t* h, int64_t, int) {
    auto* self = static_cast<GroupGuard*>(h->data);
    self->running_ = false;
    uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
  };
  process_.data = this;
  const int rc = uv_spawn(loop, &process_, &opts);
  ::close(sv[1]);
  if (rc < 0) {
    ::close(sv[0]);
    // uv_spawn initialised the handle even when it failed: it must still be closed.
    uv_close(reinterpret_cast<uv_handle_t*>(&process_), nullptr);
    return false;
  }
  fd_ = sv[0];
  running_ = true;
  return true;
}

void GroupGuard::send(const std::string& line) {
  if (fd_ < 0) return;
  // A few bytes into a socket buffer the guard keeps empty; never blocking the loop: should
  // the guard be gone (or, absurdly, behind), the run merely goes on less guarded.
  (void)::send(fd_, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void GroupGuard::add(int pgid) {
  if (pgid > 1) send('+' + std::to_string(pgid) + "\n");
}
void GroupGuard::remove(int pgid) {
  if (pgid > 1) send('-' + std::to_string(pgid) + "\n");
}
void GroupGuard::add_process(int pid, unsigned long long start) {
  if (pid > 1) send('p' + std::to_string(pid) + ' ' + std::to_string(start) + "\n");
}
void GroupGuard::remove_process(int pid) {
  if (pid > 1) send('q' + std::to_string(pid) + "\n");
}

void GroupGuard::stop() {
  if (fd_ >= 0) {
    send("x\n");  // a normal end: the guard must not take it for the host's death
    ::close(fd_);
    fd_ = -1;
  }
  // Not reaped yet (its exit callback has not run), so the pid is still the guard's.
  if (running_) ::kill(process_.pid, SIGKILL);
}

}  // namespace airhost::detail
