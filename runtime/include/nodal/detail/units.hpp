// Byte counts in words for messages: "64 MiB". Internal.
#pragma once

#include <cstddef>
#include <string>

namespace nodal::detail {

/// 1536 -> "1.5 KiB", 67108864 -> "64 MiB".
std::string format_bytes(std::size_t bytes);

/// "64M", "1G", "4096", "2.5GiB" -> bytes; throws UsageError for anything else.
std::size_t parse_bytes(const std::string& text);

}  // namespace nodal::detail
