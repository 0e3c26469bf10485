// errors.hpp — the error every layer raises for bad input given by the user.
#pragma once

#include <stdexcept>

namespace airhost::detail {

// A configuration, command-line or table error: something the user gave is wrong. what() is
// one sentence naming what was wrong (for a file: "FILE:LINE:COLUMN: key 'timeout': ...") and
// what to do. The CLI exits 2 on it; the Python API raises ValueError.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace airhost::detail
