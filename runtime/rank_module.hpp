#pragma once
namespace airhost::rank {
// The control channel's descriptor in this rank, -1 when run outside airhost.
extern int control_fd;
}
