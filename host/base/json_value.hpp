// json_value.hpp — a small JSON reader, for the records airhost itself writes (run.json): what
// `airhost runs`, `logs` and `cancel` read back. Not a general-purpose library: no streaming,
// no writer (the writers build their text by hand, json_escape), numbers as double.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace airhost::detail {

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class JsonValue {
 public:
  enum class Type { null, boolean, number, string, array, object };

  // Parses one JSON text (whitespace around it allowed). Throws JsonError naming the byte
  // offset and what was expected there.
  static JsonValue parse(std::string_view text);

  Type type() const noexcept { return type_; }
  bool is_null() const noexcept { return type_ == Type::null; }

  // Lenient getters: a missing key or another type gives the fallback, so that a reader of
  // an older or newer record shows what it can instead of refusing it.
  const JsonValue& operator[](const std::string& key) const;  // a null value when absent
  const JsonValue& operator[](std::size_t i) const;           // a null value when out of range
  std::string str(const std::string& fallback = "") const;
  double num(double fallback = 0) const;
  long long integer(long long fallback = 0) const;
  bool boolean(bool fallback = false) const;
  std::size_t size() const noexcept;                          // array elements or object keys
  const std::vector<JsonValue>& items() const noexcept { return array_; }
  bool has(const std::string& key) const { return object_.count(key) != 0; }

 private:
  friend class JsonParser;
  Type type_ = Type::null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::map<std::string, JsonValue> object_;
};

}  // namespace airhost::detail
