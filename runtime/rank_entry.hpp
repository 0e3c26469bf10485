// rank_entry.hpp — the one symbol of libairhost-rank-py.so that airhost-rank calls.
#pragma once

extern "C" {
// Runs a rank (or a warm server) from airhost-rank's command line, once the right libpython
// is loaded. Returns the process exit code.
int airhost_rank_main(int argc, char** argv);
using airhost_rank_main_fn = int (*)(int, char**);
}
