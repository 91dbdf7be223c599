#include "shm/vector_collectives.hpp"

#include "copy.hpp"
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// A staging area: [counts: n][recv_counts: n] as uint64, then the data at a cache line.
std::size_t table_bytes(int n) { return (2 * static_cast<std::size_t>(n) * 8 + kCacheLine - 1) / kCacheLine * kCacheLine; }

/// Elements this rank stages (its data that peers read).
std::size_t staged_elements(const CommState& c, const CollCall& call) {
  const auto sum = [&](const std::size_t* counts) {
    return counts ? std::accumulate(counts, counts + c.size, std::size_t{0}) : std::size_t{0};
  };
  switch (call.kind) {
    case CollKind::allgatherv:
    case CollKind::gatherv: return call.count;
    case CollKind::scatterv: return c.rank == call.root ? sum(call.counts) : 0;
    case CollKind::alltoallv:
    case CollKind::reduce_scatterv: return sum(call.counts);
    default: return 0;
  }
}

/// Rank j's staged view of call `seq`.
struct Staged {
  const std::uint64_t* counts;
  const std::uint64_t* recv_counts;
  const std::byte* data;
};

Staged staged_of(const CommState& c, int j, std::uint64_t seq) {
  const auto* base = static_cast<const std::byte*>(c.arena->at(c.header(j, seq).input_offset));
  const auto* table = reinterpret_cast<const std::uint64_t*>(base);
  return {table, table + c.size, base + table_bytes(c.size)};
}

/// Sum of counts[0 .. upto).
std::size_t prefix(const std::uint64_t* counts, int upto) {
  return std::accumulate(counts, counts + upto, std::size_t{0});
}

[[noreturn]] void disagree(const CommState& c, const CollCall& call, const std::string& what) {
  throw UsageError(fmt::format("{} on communicator '{}': {}; every rank must pass the same counts", coll_kind_name(call.kind),
                               c.name, what));
}

/// Every check reads only what every rank staged, in the same order, so every rank throws the
/// same UsageError at the same call (and the communicator goes on with the next one).
void check_counts(const CommState& c, const CollCall& call, std::uint64_t seq) {
  check_vector_counts(c, call, [&](int j) {
    const Staged staged = staged_of(c, j, seq);
    return VectorCounts{c.header(j, seq).count, staged.counts, staged.recv_counts};
  });
}

}  // namespace

void check_vector_counts(const CommState& c, const CollCall& call, const std::function<VectorCounts(int)>& counts_of) {
  const int n = c.size;
  std::vector<VectorCounts> all;
  for (int j = 0; j < n; ++j) all.push_back(counts_of(j));
  switch (call.kind) {
    case CollKind::allgatherv:
    case CollKind::reduce_scatterv:
      for (int j = 0; j < n; ++j) {
        for (int p = 0; p < n; ++p) {
          if (all[j].counts[p] != all[0].counts[p]) {
            disagree(c, call, fmt::format("rank {} passes counts[{}] = {} but rank 0 passes {}", j, p, all[j].counts[p],
                                          all[0].counts[p]));
          }
        }
        if (all[0].counts[j] != all[j].own) {
          disagree(c, call, fmt::format("rank {} {} {} elements but counts[{}] = {}", j,
                                        call.kind == CollKind::allgatherv ? "sends" : "receives", all[j].own, j,
                                        all[0].counts[j]));
        }
      }
      return;
    case CollKind::gatherv:
    case CollKind::scatterv:
      for (int j = 0; j < n; ++j) {
        if (all[call.root].counts[j] != all[j].own) {
          disagree(c, call, fmt::format("rank {} {} {} elements but the root's counts[{}] = {}", j,
                                        call.kind == CollKind::gatherv ? "sends" : "receives", all[j].own, j,
                                        all[call.root].counts[j]));
        }
      }
      return;
    case CollKind::alltoallv:
      for (int p = 0; p < n; ++p) {
        for (int q = 0; q < n; ++q) {
          if (all[p].counts[q] != all[q].recv_counts[p]) {
            disagree(c, call, fmt::format("rank {} sends {} elements to rank {}, which expects {} (its recv_counts[{}])",
                                          p, all[p].counts[q], q, all[q].recv_counts[p], p));
          }
        }
      }
      return;
    default: return;
  }
}

std::uint64_t stage_vector_call(CommState& c, const CollCall& call, std::uint64_t seq) {
  const std::size_t esize = element_size(call.dtype);
  const std::size_t data_bytes = staged_elements(c, call) * esize;
  if (data_bytes > SIZE_MAX - table_bytes(c.size)) {  // the callers bound data_bytes by SIZE_MAX only
    throw UsageError(fmt::format("{} on communicator '{}': {} bytes to stage do not fit in memory",
                                 coll_kind_name(call.kind), c.name, data_bytes));
  }
  const std::size_t need = table_bytes(c.size) + data_bytes;
  const std::size_t parity = seq & 1;
  if (c.vector_capacity[parity] < need) {
    // The old area was last read in call seq - 2, which every peer has finished (header comment).
    if (c.vector_scratch[parity] != nullptr) c.arena->deallocate(c.vector_scratch[parity]);
    c.vector_scratch[parity] = nullptr;
    c.vector_capacity[parity] = 0;
    const std::size_t capacity = std::max(need, c.vector_capacity[parity ^ 1]);
    c.vector_scratch[parity] = static_cast<std::byte*>(c.arena->allocate(capacity, kCacheLine));
    c.vector_capacity[parity] = capacity;
  }
  std::byte* area = c.vector_scratch[parity];
  auto* table = reinterpret_cast<std::uint64_t*>(area);
  for (int j = 0; j < c.size; ++j) {
    table[j] = call.counts ? call.counts[j] : 0;
    table[c.size + j] = call.recv_counts ? call.recv_counts[j] : 0;
  }
  if (data_bytes != 0) copy_bytes(area + table_bytes(c.size), call.input, data_bytes);
  return c.arena->offset_of(area);
}

void finish_vector_call(CommState& c, const CollCall& call, std::uint64_t seq) {
  check_counts(c, call, seq);
  const int n = c.size, r = c.rank;
  const std::size_t es = element_size(call.dtype);
  auto* out = static_cast<std::byte*>(call.output);
  const auto* in = static_cast<const std::byte*>(call.input);
  switch (call.kind) {
    case CollKind::allgatherv:
    case CollKind::gatherv: {
      if (call.kind == CollKind::gatherv && r != call.root) return;
      const std::uint64_t* counts = staged_of(c, r, seq).counts;
      std::size_t offset = 0;
      for (int p = 0; p < n; ++p) {
        const std::byte* from = p == r ? in : staged_of(c, p, seq).data;
        copy_bytes(out + offset * es, from, counts[p] * es);
        offset += counts[p];
      }
      return;
    }
    case CollKind::scatterv: {
      const Staged root = staged_of(c, call.root, seq);
      const std::size_t offset = prefix(root.counts, r);
      copy_bytes(out, (r == call.root ? in : root.data) + offset * es, root.counts[r] * es);
      return;
    }
    case CollKind::alltoallv: {
      const std::uint64_t* recv = staged_of(c, r, seq).recv_counts;
      std::size_t offset = 0;
      for (int p = 0; p < n; ++p) {
        const Staged from = staged_of(c, p, seq);
        const std::size_t at = prefix(from.counts, r);
        copy_bytes(out + offset * es, (p == r ? in : from.data) + at * es, recv[p] * es);
        offset += recv[p];
      }
      return;
    }
    case CollKind::reduce_scatterv: {
      const std::uint64_t* counts = staged_of(c, r, seq).counts;
      const std::size_t at = prefix(counts, r) * es;
      std::vector<const void*> sources(static_cast<std::size_t>(n));
      for (int p = 0; p < n; ++p) sources[p] = (p == r ? in : staged_of(c, p, seq).data) + at;
      reduce_n(call.dtype, call.op, call.output, sources.data(), n, counts[r]);
      return;
    }
    default: return;
  }
}

}  // namespace nodal::detail
