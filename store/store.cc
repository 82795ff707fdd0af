#include "store/store.h"

#include <fmt/format.h>

#include <cctype>
#include <limits>
#include <stdexcept>

namespace switchboard {

Bytes to_bytes(std::string_view text) { return Bytes(text.begin(), text.end()); }

std::string to_string(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::string format_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    out += fmt::format("{}\"{}\"", i == 0 ? "" : ", ", keys[i]);
  }
  return out + "]";
}

bool parse_store_integer(const Bytes& value, int64_t* out) {
  size_t i = 0;
  while (i < value.size() && std::isspace(value[i])) ++i;
  bool negative = false;
  if (i < value.size() && (value[i] == '+' || value[i] == '-')) {
    negative = value[i] == '-';
    ++i;
  }
  // Accumulate as a negative number so INT64_MIN parses without overflow.
  int64_t result = 0;
  size_t digits = 0;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (; i < value.size() && value[i] >= '0' && value[i] <= '9'; ++i, ++digits) {
    int digit = value[i] - '0';
    if (result < (kMin + digit) / 10) return false;
    result = result * 10 - digit;
  }
  if (digits == 0) return false;
  if (!negative) {
    if (result == kMin) return false;
    result = -result;
  }
  *out = result;
  return true;
}

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys) {
  wait(keys);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys,
                      const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw std::invalid_argument(fmt::format(
        "multi_set: {} keys but {} values", keys.size(), values.size()));
  }
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void Store::append(const std::string& key, const Bytes& value) {
  // Compare-and-set loop for stores without a native append. compare_set
  // returns `desired` both on success and when another writer stored exactly
  // `desired` meanwhile; that writer's value is then taken as ours.
  Bytes current = check({key}) ? get(key) : Bytes{};
  for (;;) {
    Bytes desired = current;
    desired.insert(desired.end(), value.begin(), value.end());
    Bytes seen = compare_set(key, current, desired);
    if (seen == desired) return;
    current = std::move(seen);
  }
}

}  // namespace switchboard
