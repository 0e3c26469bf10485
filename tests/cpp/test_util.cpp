#include <doctest/doctest.h>

#include "base/util.hpp"

using namespace airhost::detail;

TEST_CASE("a shell-quoted word reaches the program unchanged, quotes and dollars included") {
  for (std::string word : {"plain", "it's", "$HOME `x` \"q\"", "", "a b\tc"}) {
    std::string out;
    CHECK(run_capture("printf %s " + shell_quote(word), out) == 0);
    CHECK(out == word);
  }
}

TEST_CASE("run_capture returns the command's status and its whole stdout") {
  std::string out;
  CHECK(run_capture("printf 'one\\ntwo\\n'; exit 3", out) != 0);
  CHECK(out == "one\ntwo\n");
}
