#include "launch/rank/rank_starter.hpp"

#include <cstdint>
#include <system_error>

namespace airhost::detail {
namespace {

class SpawnStarter final : public RankStarter {
  struct Child {
    uv_process_t handle{};
    ExitCallback on_exit;
  };

 public:
  int start(uv_loop_t* loop, const RankStartRequest& req, ExitCallback on_exit) override {
    auto child = std::make_unique<Child>();
    child->on_exit = std::move(on_exit);
    child->handle.data = child.get();

    std::vector<char*> argv, env;
    for (auto& a : req.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : req.env) env.push_back(const_cast<char*>(e.c_str()));
    env.push_back(nullptr);

    uv_stdio_container_t stdio[4];
    stdio[0].flags = UV_IGNORE;  // /dev/null: a rank never competes for the terminal's input
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = req.stdout_fd;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = req.stderr_fd;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = req.control_fd;

    uv_process_options_t opts{};
    opts.file = argv[0];
    opts.args = argv.data();
    opts.env = env.data();
    opts.cwd = req.cwd.empty() ? nullptr : req.cwd.c_str();
    opts.stdio = stdio;
    opts.stdio_count = 4;
    // DETACHED = setsid(): the rank leads its own process group, which the teardown signals
    // as a whole, and the terminal's Ctrl-C reaches only the host, which decides.
    opts.flags = UV_PROCESS_DETACHED;
    opts.exit_cb = [](uv_process_t* h, int64_t status, int sig) {
      static_cast<Child*>(h->data)->on_exit(status, sig);
    };
    if (int rc = uv_spawn(loop, &child->handle, &opts); rc < 0)
      throw std::system_error(-rc, std::generic_category(), "cannot start " + req.argv[0]);
    int pid = child->handle.pid;
    children_.push_back(std::move(child));
    return pid;
  }

  void close() override {
    for (auto& c : children_) {
      // The Child must outlive the handle until libuv's close callback has run.
      c->handle.data = c.get();
      uv_close(reinterpret_cast<uv_handle_t*>(&c->handle), [](uv_handle_t* h) {
        delete static_cast<Child*>(h->data);
      });
      (void)c.release();
    }
    children_.clear();
  }

  ~SpawnStarter() override {
    // close() hands ownership to libuv; anything left here never reached the loop.
  }

 private:
  std::vector<std::unique_ptr<Child>> children_;
};

}  // namespace

std::unique_ptr<RankStarter> make_spawn_starter() { return std::make_unique<SpawnStarter>(); }

}  // namespace airhost::detail
