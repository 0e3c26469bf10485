#pragma once
// The Python this airhost was built for ("3.11"): the one pip installed it with, whose
// interpreter it launches by default and whose libpython its ranks load. One small source
// holds it, so that the rest of libairhost is the same for every Python and compiles once for
// all four wheels (scripts/build-wheels.sh shares it through ccache).
namespace airhost::detail {
const char* built_python_version() noexcept;
}  // namespace airhost::detail
