#include "base/built_for.hpp"

// CMakeLists.txt defines AIRHOST_PYTHON_VERSION for this source alone.
namespace airhost::detail {
const char* built_python_version() noexcept { return AIRHOST_PYTHON_VERSION; }
}  // namespace airhost::detail
