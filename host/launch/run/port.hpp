// port.hpp — a MASTER_PORT that no concurrent launch on this machine can also get.
#pragma once

#include <string>

namespace airhost::detail {

// Picking a free port and closing it (what torchrun does) leaves a window in which another
// launch picks the same one: "Address already in use". Instead the host keeps a socket
// bound to the port, with SO_REUSEADDR and never listening, for the whole run:
//  - the kernel never hands the port to another bind(port 0) or to an outgoing
//    connection while a socket is bound to it, so concurrent launches cannot collide;
//  - rank 0's TCPStore also sets SO_REUSEADDR, and Linux lets a second SO_REUSEADDR
//    socket bind and listen on a port whose other sockets are not listening.
// That same leniency would let two airhost runs given one explicit --master-port both
// "reserve" it, so each reservation also holds an flock on /tmp/airhost-ports/PORT.lock,
// which another airhost on this machine, of any user, cannot take while the run lives.
class PortReservation {
 public:
  PortReservation() = default;
  // Reserves `port`, or a free port when 0. Throws std::system_error on failure.
  static PortReservation reserve(int port = 0);
  ~PortReservation();
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;

  int port() const noexcept { return port_; }
  void release() noexcept;

 private:
  static PortReservation reserve_once(int port);
  int fd4_ = -1;
  int fd6_ = -1;
  int lock_fd_ = -1;
  int port_ = 0;
};

}  // namespace airhost::detail
