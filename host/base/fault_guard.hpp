// fault_guard.hpp — a read of memory that another thread may be changing, which survives a fault.
//
// A rank answers `airhost stacks` from a signal handler, walking CPython's thread states
// without the GIL as faulthandler does: that is what lets a rank stuck in a C call that holds
// the GIL answer at all. But the other threads keep running while it reads, and a thread
// that pushes or pops frames (an import, a data-loader thread) can free the memory being
// read. faulthandler reads that way only when the process is dying anyway; a rank asked for
// its stacks must live on. read_guarded() runs the read with SIGSEGV and SIGBUS caught for
// the calling thread only (a fault of another thread still reaches whatever handled it
// before: faulthandler, or the default action), and says whether it faulted.
//
// Async-signal-safe: meant to be called from a signal handler. One guarded read at a time in
// the process; a second one while the first runs returns false at once.
#pragma once

namespace airhost::detail {

// Runs read(arg) and returns true, or false if it faulted (the read stopped where it did)
// or another guarded read was running.
bool read_guarded(void (*read)(void*), void* arg) noexcept;

}  // namespace airhost::detail
