#include "ipc_plan.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace nodal::detail::cuda_ipc {

std::size_t one_pass_max_bytes() {
  static const std::size_t value = [] {
    const std::string text = getenv_or_empty("NODAL_IPC_ONE_PASS_MAX_BYTES");
    if (text.empty()) return kDefaultOnePassMax;
    try {
      return parse_bytes(text);
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("NODAL_IPC_ONE_PASS_MAX_BYTES='{}': {}", text, e.what()));
    }
  }();
  return value;
}

Algorithm choose_algorithm(std::size_t bytes, int n, std::size_t one_pass_max) noexcept {
  // One rank has nothing to scatter; small calls are latency: one kernel, one round of flags.
  if (n <= 1 || bytes <= one_pass_max) return Algorithm::one_pass;
  return Algorithm::reduce_scatter_allgather;
}

Range share_range(std::size_t count, std::size_t elem_size, int n, int r) noexcept {
  if (n <= 0 || r < 0 || r >= n || elem_size == 0) return {};
  // Units of kShareAlign bytes (elem_size divides it: 1, 2, 4, 8), dealt out evenly in rank order.
  const std::size_t unit = std::max<std::size_t>(1, kShareAlign / elem_size);
  const std::size_t units = (count + unit - 1) / unit;
  const auto nn = static_cast<std::size_t>(n);
  const auto rr = static_cast<std::size_t>(r);
  const std::size_t first = units / nn * rr + std::min(rr, units % nn);
  const std::size_t last = units / nn * (rr + 1) + std::min(rr + 1, units % nn);
  return {std::min(first * unit, count), std::min(last * unit, count)};
}

std::size_t max_share(std::size_t count, std::size_t elem_size, int n) noexcept {
  return share_range(count, elem_size, n, 0).size();  // rank 0 takes a remainder unit first
}

namespace {
std::size_t round_up(std::size_t value, std::size_t to) { return (value + to - 1) / to * to; }
}  // namespace

ScratchLayout scratch_layout(Kind kind, Algorithm algorithm, std::size_t count, std::size_t elem_size,
                             int n) noexcept {
  ScratchLayout layout;
  switch (kind) {
    case Kind::allreduce:
    case Kind::reduce:
      layout.staging_bytes = count * elem_size;
      if (algorithm == Algorithm::reduce_scatter_allgather) layout.reduced_bytes = max_share(count, elem_size, n) * elem_size;
      break;
    case Kind::broadcast:
    case Kind::allgather: layout.staging_bytes = count * elem_size; break;
    case Kind::reduce_scatter: layout.staging_bytes = static_cast<std::size_t>(n) * count * elem_size; break;
    case Kind::barrier: break;
  }
  layout.reduced_offset = layout.reduced_bytes ? round_up(layout.staging_bytes, kShareAlign) : layout.staging_bytes;
  return layout;
}

std::size_t grow_scratch(std::size_t current, std::size_t needed) noexcept {
  if (needed <= current) return current;
  return std::bit_ceil(std::max(needed, kMinScratch));
}

bool large_call(Kind kind, std::size_t count, std::size_t elem_size, int n, std::size_t one_pass_max) noexcept {
  const std::size_t bytes = count * elem_size;
  switch (kind) {
    case Kind::allreduce:
    case Kind::reduce: return choose_algorithm(bytes, n, one_pass_max) == Algorithm::reduce_scatter_allgather;
    case Kind::reduce_scatter:
      return choose_algorithm(static_cast<std::size_t>(n > 0 ? n : 0) * bytes, n, one_pass_max) ==
             Algorithm::reduce_scatter_allgather;
    case Kind::broadcast:
    case Kind::allgather: return n > 1 && bytes > one_pass_max;
    case Kind::barrier: return false;
  }
  return false;
}

Overlap input_overlap(Kind kind, const void* input, const void* output, std::size_t count, std::size_t elem_size,
                      int n, int rank) noexcept {
  const std::size_t bytes = count * elem_size;
  const std::size_t all = static_cast<std::size_t>(n > 0 ? n : 0) * bytes;
  const std::size_t mine = static_cast<std::size_t>(rank > 0 ? rank : 0) * bytes;
  const auto* in = static_cast<const std::byte*>(input);
  const auto* out = static_cast<const std::byte*>(output);
  std::size_t in_bytes = 0, out_bytes = 0;
  bool same = false;
  switch (kind) {
    case Kind::allreduce:
    case Kind::reduce:
      in_bytes = out_bytes = bytes;
      same = in == out;
      break;
    case Kind::allgather:
      in_bytes = bytes;
      out_bytes = all;
      // Compared as integers: `out + mine` is no valid pointer arithmetic when output is null.
      same = reinterpret_cast<std::uintptr_t>(in) == reinterpret_cast<std::uintptr_t>(out) + mine;
      break;
    case Kind::reduce_scatter:
      in_bytes = all;
      out_bytes = bytes;
      same = reinterpret_cast<std::uintptr_t>(out) == reinterpret_cast<std::uintptr_t>(in) + mine;
      break;
    case Kind::broadcast:
    case Kind::barrier: return Overlap::none;
  }
  if (input == nullptr || output == nullptr || !overlaps(input, in_bytes, output, out_bytes)) return Overlap::none;
  return same ? Overlap::in_place : Overlap::partial;
}

bool input_readable_in_place(Kind kind, Overlap overlap, bool root) noexcept {
  switch (kind) {
    case Kind::allreduce:
    case Kind::allgather:
    case Kind::reduce_scatter: return overlap != Overlap::partial;
    case Kind::reduce: return !root || overlap != Overlap::partial;
    case Kind::broadcast: return root;
    case Kind::barrier: return false;
  }
  return false;
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace nodal::detail::cuda_ipc
