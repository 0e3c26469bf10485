// airhost/airhost.hpp — the whole public C++ API of libairhost.
#pragma once

#include "airhost/exit_code.hpp"
#include "airhost/callbacks.hpp"
#include "airhost/launch.hpp"
#include "airhost/launcher.hpp"
#include "airhost/report.hpp"

namespace airhost {
// The library's version, "MAJOR.MINOR.PATCH".
const char* version() noexcept;
}  // namespace airhost
