#pragma once
namespace airhost::rank {
// The control channel's descriptor in this rank, -1 when run outside airhost.
extern int control_fd;
// The process the channel belongs to: a process forked from the rank (a DataLoader worker, a
// daemon) inherits the descriptor, but its frames would interleave with the rank's and
// corrupt the stream, and its exceptions are not the rank's. It sends nothing.
extern int control_pid;
}
