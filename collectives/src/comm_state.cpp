#include "comm_state.hpp"

#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <sys/prctl.h>
#include <unistd.h>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

constexpr std::uint64_t kCommMagic = 0x346d6d6f632d6c6eULL;  // "nl-comm4": CallHeader (staging) and SharedComm as of 2026-11-29

std::size_t env_bytes(const char* name, std::size_t fallback, std::size_t minimum) {
  std::string text = getenv_or_empty(name);
  if (text.empty()) return fallback;
  std::size_t value = 0;
  try {
    value = parse_bytes(text);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{}='{}': {}", name, text, e.what()));
  }
  if (value < minimum) throw UsageError(fmt::format("{}='{}' is below the minimum of {} bytes", name, text, minimum));
  return value;
}

std::size_t round_up(std::size_t value, std::size_t to) { return (value + to - 1) / to * to; }

}  // namespace

const char* coll_kind_name(CollKind kind) noexcept {
  switch (kind) {
    case CollKind::barrier: return "barrier";
    case CollKind::allreduce: return "allreduce";
    case CollKind::reduce: return "reduce";
    case CollKind::broadcast: return "broadcast";
    case CollKind::allgather: return "allgather";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::gather: return "gather";
    case CollKind::scatter: return "scatter";
    case CollKind::alltoall: return "alltoall";
    case CollKind::split: return "split";
    case CollKind::allgatherv: return "allgatherv";
    case CollKind::gatherv: return "gatherv";
    case CollKind::scatterv: return "scatterv";
    case CollKind::alltoallv: return "alltoallv";
    case CollKind::reduce_scatterv: return "reduce_scatterv";
  }
  return "?";
}

std::size_t CommConfig::slot_data_bytes(std::size_t world_size, bool crowded) const {
  if (small_max_set) return small_max;
  return has_wide_slots(world_size, crowded) ? kSmallSlotMaxBytes : kSmallMaxBytes;
}

std::size_t CommConfig::slot_bytes(std::size_t world_size, bool crowded) const {
  return round_up(kInlineOffset + slot_data_bytes(world_size, crowded), kCacheLine);
}

std::uint64_t CommConfig::slot_depth(std::size_t world_size, bool crowded) const {
  const std::size_t data = std::max<std::size_t>(slot_data_bytes(world_size, crowded), 1);
  const std::uint64_t per_rank =
      std::clamp<std::uint64_t>(kSlotBudget / slot_bytes(world_size, crowded), 2, kRankBudgetMaxDepth);
  const std::uint64_t per_comm = std::min<std::uint64_t>(kCommSlotBudget / (world_size * data), kMaxSlotDepth);
  return std::bit_floor(std::max(per_rank, per_comm));
}

bool cma_allowed() {
  // Asked at every open (not a hot path), not once: a fork()ed child keeps its parent's answer
  // but not its ptracer setting, which the kernel keeps per process.
  if (getenv_or_empty("NODAL_CMA") == "0" || ::prctl(PR_GET_DUMPABLE) != 1) return false;
  // Yama's ptrace_scope 1 (Ubuntu's default) limits process_vm_readv/writev to a process's
  // ancestors and the ptracers it names: ranks are siblings, so each names any process of its
  // user (PR_SET_PTRACER_ANY), as Open MPI's smsc/cma does; it then may be ptraced by them as with
  // scope 0. 2 (admin only) and 3 (none) leave no such way.
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (yama && (yama >> scope) && scope != 0) {
    return scope == 1 && ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0;
  }
  return true;
}

const CommConfig& comm_config() {
  static const CommConfig config = [] {
    CommConfig c{};
    c.small_max_set = !getenv_or_empty("NODAL_SMALL_MAX_BYTES").empty();
    c.small_max = env_bytes("NODAL_SMALL_MAX_BYTES", kSmallMaxBytes, 0);
    // Chunks are cut into world_size blocks of whole cache lines (up to 8-byte elements).
    c.chunk_bytes = round_up(env_bytes("NODAL_CHUNK_BYTES", 1024 * 1024, 4096), kCacheLine);
    c.ring_depth = 2;
    // Below it the system call costs more than the second copy of staging (16 KiB: bench/results/
    // 2026-11-25-cma-threshold.md, 2x faster than staging at 32 KiB).
    c.cma_min_bytes = env_bytes("NODAL_CMA_MIN_BYTES", 16 * 1024, 0);
    c.staging = staging_setting_from_env();
    // Checked here, where every rank passes before its first call, not at the first fold, which
    // only some ranks of a call make.
    check_reduce_isa_setting();
    return c;
  }();
  return config;
}

std::uint64_t members_hash(const std::vector<int>& ranks, std::string_view salt) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](const void* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ULL;
  };
  for (int r : ranks) mix(&r, sizeof r);
  mix(salt.data(), salt.size());
  return h;
}

std::shared_ptr<CommState> open_comm(Arena& arena, std::string name, int rank, std::vector<int> global_ranks) {
  auto state = std::make_shared<CommState>();
  state->arena = &arena;
  state->name = std::move(name);
  state->rank = rank;
  state->size = static_cast<int>(global_ranks.size());
  state->global_ranks = std::move(global_ranks);
  state->config = comm_config();
  state->staging_stores = StagingStores(state->config.staging);
  // A chunk holds one cache line per member at least.
  state->config.chunk_bytes = std::max(state->config.chunk_bytes, state->global_ranks.size() * kCacheLine);
  const std::size_t n = static_cast<std::size_t>(state->size);
  // The larger slots of crowded 2-4 rank communicators serve the ops that take the small path
  // further there (shm/algorithm_table.hpp small_max_bytes); every member reads the same
  // NODAL_CROWDED, and the creator's answer is the communicator's (SharedComm::crowded).
  const bool crowded = oversubscribed();
  const std::size_t slot_bytes = state->config.slot_bytes(n, crowded);
  const std::size_t header_bytes = round_up(sizeof(SharedComm), kCacheLine);
  const std::size_t progress_bytes = n * sizeof(Progress);
  const std::uint64_t depth = state->config.slot_depth(n, crowded);
  const std::size_t total = header_bytes + progress_bytes + n * depth * slot_bytes;
  std::string object = "nodal.comm:" + state->name;
  auto* base = static_cast<std::byte*>(arena.find_or_create(object.c_str(), total, kCacheLine, [&](void* where) {
    std::memset(where, 0, total);
    auto* shared = new (where) SharedComm{};
    shared->magic = kCommMagic;
    shared->world_size = static_cast<std::int32_t>(n);
    shared->slot_bytes = slot_bytes;
    shared->cma_min_bytes = state->config.cma_min_bytes;
    shared->members_hash = members_hash(state->global_ranks);
    shared->crowded = crowded ? 1 : 0;
    auto* progress = reinterpret_cast<Progress*>(static_cast<std::byte*>(where) + header_bytes);
    for (std::size_t r = 0; r < n; ++r) new (&progress[r]) Progress();
  }));
  state->shared = reinterpret_cast<SharedComm*>(base);
  if (state->shared->magic != kCommMagic || state->shared->world_size != static_cast<std::int32_t>(n) ||
      state->shared->slot_bytes != slot_bytes || state->shared->cma_min_bytes != state->config.cma_min_bytes) {
    throw UsageError(fmt::format("communicator {}: ranks disagree on its size, NODAL_SMALL_MAX_BYTES, "
                                 "NODAL_CMA_MIN_BYTES or NODAL_CROWDED (set the same environment for every rank)",
                                 state->name));
  }
  if (state->shared->members_hash != members_hash(state->global_ranks)) {
    throw UsageError(fmt::format("communicator {}: its members list its ranks in different orders (every member "
                                 "must pass the same ranks in the same order)",
                                 state->name));
  }
  state->progress = reinterpret_cast<Progress*>(base + header_bytes);
  state->progress[rank].pid = static_cast<std::int32_t>(::getpid());
  state->progress[rank].cma = cma_allowed() ? 1 : 0;
  state->slots = base + header_bytes + progress_bytes;
  state->slot_depth = depth;
  state->slot_bytes = slot_bytes;
  return state;
}

void CommState::ensure_ring() {
  if (stages != nullptr) return;
  const std::size_t n = static_cast<std::size_t>(size);
  const std::size_t per_rank = static_cast<std::size_t>(config.ring_depth) * config.chunk_bytes;
  const std::size_t total = 4096 + 2 * n * per_rank;
  std::string object = "nodal.comm-ring:" + name;
  // Pages are reserved by the arena; the ring's contents need no initialisation.
  auto* base = static_cast<std::byte*>(arena->find_or_create(object.c_str(), total, 4096, [&](void* where) {
    static_cast<SharedRing*>(where)->magic = kCommMagic;
  }));
  stages = base + 4096;  // page-aligned data, apart from the header's line
  results = stages + n * per_rank;
}

void wait_flag(const CommState& comm, const std::atomic<std::uint64_t>& flag, std::uint64_t value, const char* what) {
  wait_on_comm(comm, [&] { return flag.load(std::memory_order_acquire) >= value; }, what);
}

void mark_comm_broken(const CommState& comm, CollKind kind, std::uint64_t seq, const std::exception& error) {
  if (job_failed()) return;
  SharedComm& shared = *comm.shared;
  std::uint32_t free = 0;
  if (!shared.broken_claim.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) return;
  // snprintf straight into the arena: nothing to allocate while an error is on its way.
  std::snprintf(shared.broken_reason, sizeof shared.broken_reason, "rank %d left %s #%llu part-way: %s",
                comm.global_ranks[static_cast<std::size_t>(comm.rank)], coll_kind_name(kind),
                static_cast<unsigned long long>(seq), error.what());
  shared.broken.store(1, std::memory_order_release);
  notify(shared.word);
}

void throw_comm_broken(const CommState& comm) {
  throw PeerFailure(fmt::format("communicator '{}' cannot be used any more: {}", comm.name, comm.shared->broken_reason));
}

}  // namespace nodal::detail
