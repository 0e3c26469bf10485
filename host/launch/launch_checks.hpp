// launch_checks.hpp — what a launch is checked for before anything starts: the spec itself
// (ranks, nodes, the entry point and its Python, the warm server's terms), the descriptors it
// will need (the soft limit raised where the hard one allows), and, when the system refuses an
// attempt what it needs, what to do about it.
#pragma once

#include <exception>
#include <string>

#include "airhost/launch.hpp"

namespace airhost::detail {

// The rank runtime's --kind for an entry point: script, module, function-script,
// function-module or pickled.
std::string entry_kind(const Entry& e);
// Raises this process's soft limit on open files when `nprocs` ranks (and, on node 0, the
// connections of `peers` other nodes) need more than it allows; throws LaunchError, before
// anything starts, when even the hard limit is too low.
void ensure_descriptors_for(int nprocs, int peers);
// What to do about an error of the system that stopped an attempt from starting (" (this
// process used up its open files: ...)"), or "".
std::string resource_hint(const std::exception& e);
// Throws LaunchError naming what is wrong with `spec` and what to do, before anything starts.
void validate(const LaunchSpec& spec, const std::string& rank_binary);

}  // namespace airhost::detail
