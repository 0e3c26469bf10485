// fuzz_stacks_request.cpp — a request line on the run's stacks socket (launch/watch/stacks_service.hpp),
// which any local process of the user's may write.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "launch/watch/stacks_service.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto r = airhost::detail::parse_stacks_request(std::string_view(reinterpret_cast<const char*>(data), size));
  if (r.sample_ms < -1) __builtin_trap();  // -1 stands for any value that is no duration
  return 0;
}
