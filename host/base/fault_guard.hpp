// fault_guard.hpp — a read of memory that another thread may be changing, which survives a fault.
//
// A rank answers `airhost stacks` from a thread of airhost's own, walking CPython's thread
// states without the GIL as faulthandler does: that is what lets a rank stuck in a C call that
// holds the GIL answer at all. But the other threads keep running while it reads, and a thread
// that pushes or pops frames (an import, a data-loader thread) can free the memory being
// read. faulthandler reads that way only when the process is dying anyway; a rank asked for
// its stacks must live on.
//
// read_guarded() runs the read in a helper task that shares the process's memory and open
// files but not its signal handlers (clone(2) with CLONE_VM and CLONE_FILES, without
// CLONE_SIGHAND), and waits for it: a fault in the read ends that task alone, never the
// process. The process's own SIGSEGV and SIGBUS handlers are never touched, so a handler that
// another library installs (faulthandler.enable(), a JVM, a crash reporter), before, during or
// after a read, stays as it installed it, and a real fault of any thread reaches it.
//
// Async-signal-safe (it may be called from a signal handler too). One guarded read at a time in
// the process; a second one while the first runs returns false at once. The read may write to
// descriptors (they are shared) and to memory; it must not take locks or allocate with malloc.
#pragma once

namespace airhost::detail {

// Runs read(arg) and returns true, or false if it faulted (the read stopped where it did),
// ran past `limit_ms`, or another guarded read was running.
bool read_guarded(void (*read)(void*), void* arg, int limit_ms = 5000) noexcept;

}  // namespace airhost::detail
