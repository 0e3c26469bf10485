// fuzz_records.cpp — what airhost reads back from disk that another process may have written:
// run.json (base/json_value.hpp, cli/run_records.hpp), a rank's stacks dump
// (launch/watch/stacks.hpp), airhost.toml (cli/config.hpp). Malformed input may only raise the
// reader's own error (JsonError, ConfigError); anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/errors.hpp"
#include "base/json_value.hpp"
#include "cli/config.hpp"
#include "cli/run_records.hpp"
#include "launch/watch/stacks.hpp"

using namespace airhost::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const JsonValue v = JsonValue::parse(text);
    (void)v["state"].str();
    (void)v["ranks"][0]["exit_code"].num();
  } catch (const JsonError&) {
  }
  (void)parse_run_record("/nonexistent/run", std::string(text));
  (void)parse_dump(text, size ? data[0] : 0);
  try {
    (void)parse_config(text, "fuzz.toml");
  } catch (const ConfigError&) {
  }
  return 0;
}
