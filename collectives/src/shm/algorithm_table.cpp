#include "shm/algorithm_table.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>

#include <limits>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// An algorithm forced by the environment, or automatic choice.
enum class Forced { none, small, pipelined, in_place };

/// Whether this node's processor is Intel's (cpuid's vendor; the copy collectives' cma ends
/// depend on it: algorithm_table.hpp).
bool intel_processor() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
#else
  return false;
#endif
}

Forced parse_forced(const char* variable) {
  std::string value = getenv_or_empty(variable);
  if (value.empty() || value == "auto") return Forced::none;
  if (value == "small") return Forced::small;
  if (value == "pipelined") return Forced::pipelined;
  if (value == "in_place") return Forced::in_place;
  throw UsageError(fmt::format("{}='{}': use auto, small, pipelined or in_place", variable, value));
}

/// NODAL_ALLREDUCE_ALGO for allreduce, else NODAL_ALGO (read once: one guard on every call).
Forced forced_algorithm(CollKind kind) {
  struct Both {
    Forced all = parse_forced("NODAL_ALGO");
    Forced allreduce = parse_forced("NODAL_ALLREDUCE_ALGO");
  };
  static const Both forced;
  return kind == CollKind::allreduce && forced.allreduce != Forced::none ? forced.allreduce : forced.all;
}

/// What a call of `kind` beyond the small path takes, in words.
std::string large_rule(CollKind kind, const CommConfig& config) {
  const std::string in_place = "in_place if every rank's buffers are in the arena, else ";
  const std::string where = " where allowed, else pipelined";
  switch (kind) {
    case CollKind::allreduce:
      return in_place + "on 2 ranks cma from " + format_bytes(kCmaAllreduceMinBytes) + " below " +
             format_bytes(kCmaAllreduceEndBytes) + " (in place up to " + format_bytes(kCmaAllreduceInPlaceMaxBytes) +
             ")" + where;
    case CollKind::reduce:
      return in_place + "while (world_size - 1) * size <= " + format_bytes(kCmaReduceMaxBytes) +
             ": linear when ranks outnumber cores, else cma from " + format_bytes(config.cma_min_bytes) +
             " where allowed; else on 2 ranks with a core each linear up to " + format_bytes(kLinearReduceMaxBytes) +
             "; else pipelined";
    case CollKind::reduce_scatter: return in_place + "pipelined";
    default:
      if (cma_copy_end_bytes(kind) == std::numeric_limits<std::size_t>::max()) {
        return in_place + "cma from " + format_bytes(config.cma_min_bytes) + where;
      }
      if (config.cma_min_bytes >= cma_copy_end_bytes(kind)) {
        return in_place + "cma from " + format_bytes(config.cma_min_bytes) + " when ranks outnumber cores" + where;
      }
      return in_place + "cma from " + format_bytes(config.cma_min_bytes) + " (below " +
             format_bytes(cma_copy_end_bytes(kind)) + " unless ranks outnumber cores)" + where;
  }
}

/// reduce of buffers not all in the arena. While the root's share of the work is small
/// ((world_size - 1) x bytes <= kCmaReduceMaxBytes) its root folds alone: reading the inputs by
/// cma while every rank has a core (bench/results/2026-11-25-collectives-round-two.md), as the
/// peers stage them (linear) when ranks share cores: 4 ranks on 2 cores 1.39-1.43x cma's speed
/// at 32-64 KiB, 3 ranks 1.07-1.8x (bench/results/2026-11-28-linear-reduce.md). On 2 ranks with a
/// core each, linear up to kLinearReduceMaxBytes beyond that (and wherever cma is not allowed).
Algorithm reduce_algorithm(std::size_t bytes, int world_size, bool cma_usable, bool crowded, Forced forced) {
  if (forced != Forced::none) return Algorithm::pipelined;
  const bool root_alone = bytes * static_cast<std::size_t>(world_size - 1) <= kCmaReduceMaxBytes;
  if (root_alone && !crowded && cma_usable) return Algorithm::cma;
  if ((root_alone && crowded) || (world_size == 2 && !crowded && bytes <= kLinearReduceMaxBytes)) {
    return Algorithm::linear;
  }
  return Algorithm::pipelined;
}

}  // namespace

const char* algorithm_name(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::small: return "small";
    case Algorithm::pipelined: return "pipelined";
    case Algorithm::in_place: return "in_place";
    case Algorithm::cma: return "cma";
    case Algorithm::linear: return "linear";
  }
  return "?";
}

std::size_t small_max_bytes(CollKind kind, int world_size, bool crowded, const CommConfig& config) noexcept {
  if (config.small_max_set) return config.small_max;
  if (has_wide_slots(static_cast<std::size_t>(world_size), crowded)) {
    if (kind == CollKind::broadcast || kind == CollKind::scatter) return kSmallSlotMaxBytes;
    if (kind == CollKind::reduce && world_size == 4) return kSmallSlotMaxBytes / 2;
  }
  return kSmallMaxBytes;
}

bool takes_small(CollKind kind, bool on_gpu, std::size_t largest_bytes, int world_size, bool crowded,
                 const CommConfig& config) {
  const Forced forced = forced_algorithm(kind);
  return !on_gpu && largest_bytes <= small_max_bytes(kind, world_size, crowded, config) &&
         (forced == Forced::none || forced == Forced::small);
}

std::size_t cma_copy_end_bytes(CollKind kind) noexcept {
  if (intel_processor()) {
    switch (kind) {
      case CollKind::broadcast:
      case CollKind::gather:
      case CollKind::scatter: return std::numeric_limits<std::size_t>::max();
      default: return kXeonCmaAllProduceEndBytes;
    }
  }
  switch (kind) {
    case CollKind::broadcast: return kCmaBroadcastEndBytes;
    case CollKind::scatter: return kCmaCopyEndBytes;
    default: return kCmaCopyAllProduceEndBytes;
  }
}

Algorithm large_algorithm(CollKind kind, std::size_t bytes, int world_size, bool in_place, bool all_in_arena,
                          bool cma_usable, bool crowded) {
  const Forced forced = forced_algorithm(kind);
  if (all_in_arena && forced != Forced::pipelined) return Algorithm::in_place;
  if (kind == CollKind::reduce) return reduce_algorithm(bytes, world_size, cma_usable, crowded, forced);
  // The copy collectives read their peers' inputs once (a single copy) below 2 MiB (broadcast),
  // 1 MiB (scatter) or 512 KiB (on Intel processors further: cma_copy_end_bytes), and
  // at any size when ranks outnumber cores (algorithm_table.hpp, cma_copy_end_bytes). So does
  // allreduce on 2 ranks from 1 MiB (algorithm_table.hpp; on 4 ranks sharing 2 cores it lost,
  // 0.8x); reduce_scatter stays pipelined.
  const bool reads_inputs =
      (!is_reduction(kind) && (crowded || bytes < cma_copy_end_bytes(kind))) ||
      (kind == CollKind::allreduce && world_size == 2 && bytes >= kCmaAllreduceMinBytes &&
       (in_place ? bytes <= kCmaAllreduceInPlaceMaxBytes : bytes < kCmaAllreduceEndBytes));
  if (reads_inputs && forced == Forced::none && cma_usable) return Algorithm::cma;
  return Algorithm::pipelined;
}

std::vector<AlgorithmRule> describe_algorithm_table(const CommConfig& config) {
  std::vector<AlgorithmRule> table;
  for (CollKind kind : {CollKind::allreduce, CollKind::reduce, CollKind::reduce_scatter, CollKind::broadcast,
                        CollKind::allgather, CollKind::gather, CollKind::scatter, CollKind::alltoall}) {
    const std::string op = coll_kind_name(kind);
    const char* variable = kind == CollKind::allreduce && !getenv_or_empty("NODAL_ALLREDUCE_ALGO").empty()
                               ? "NODAL_ALLREDUCE_ALGO"
                               : "NODAL_ALGO";
    const Forced forced = forced_algorithm(kind);
    if (forced == Forced::none) {
      std::string small = is_rooted(kind) ? "small (the sender posts and returns)" : "small";
      // Where the limit grows (small_max_bytes), in words.
      const std::size_t crowded = small_max_bytes(kind, 4, true, config);
      if (crowded != config.small_max) {
        const bool from_2 = small_max_bytes(kind, 2, true, config) == crowded;
        small += "; up to " + format_bytes(crowded) + (from_2 ? " on 2-4" : " on 4") + " ranks outnumbering cores";
      }
      table.push_back({op, config.small_max, small});
      table.push_back({op, SIZE_MAX, large_rule(kind, config)});
    } else {
      table.push_back({op, SIZE_MAX,
                       getenv_or_empty(variable) + " (forced by " + variable + "; small only up to " +
                           format_bytes(config.small_max) + ", in_place only with arena buffers)"});
    }
  }
  return table;
}

}  // namespace nodal::detail
