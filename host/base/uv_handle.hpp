// uv_handle.hpp — a libuv handle of any kind (uv_timer_t, uv_pipe_t, ...) as the uv_handle_t
// that uv_close and uv_is_closing take: each kind begins with uv_handle_t's fields (libuv's
// documented layout), so the cast is libuv's own idiom.
#pragma once

#include <uv.h>

namespace airhost::detail {

template <typename H>
uv_handle_t* as_handle(H* h) {
  return reinterpret_cast<uv_handle_t*>(h);
}

}  // namespace airhost::detail
