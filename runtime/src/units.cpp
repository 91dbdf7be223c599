#include <nodal/detail/units.hpp>
#include <nodal/errors.hpp>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace nodal::detail {

std::string format_bytes(std::size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  std::string number = fmt::format("{:.1f}", value);
  if (number.ends_with(".0")) number.resize(number.size() - 2);  // "16 MiB", not "16.0 MiB"
  return fmt::format("{} {}", number, units[unit]);
}

std::size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  std::string suffix(end ? end : "");
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 0;
  if (suffix.empty() || suffix == "B") scale = 1;
  // K, KB, KI and KIB all mean 1024 (as nodalrun's --shm-size and torch's sizes): so for M, G, T.
  const char* prefixes = "KMGT";
  for (int i = 0; i < 4; ++i) {
    std::string p(1, prefixes[i]);
    if (suffix == p || suffix == p + "B" || suffix == p + "I" || suffix == p + "IB") scale = std::ldexp(1.0, 10 * (i + 1));
  }
  // At most 1 PiB: no overflow in the conversion. Callers that cannot take 0 check for it.
  if (end == text.c_str() || scale == 0 || !(value * scale >= 0) || !(value * scale <= 0x1p50)) {
    throw UsageError(fmt::format("'{}' is not a size (examples: 4096, 64M, 2G)", text));
  }
  return static_cast<std::size_t>(value * scale);
}

}  // namespace nodal::detail
