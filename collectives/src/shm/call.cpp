// The protocol of a shared-memory call (shm/call.hpp): header, credits, lockstep or rooted, and
// mismatches. The data moves in the algorithms' files.
#include "shm/call.hpp"

#include "internode/across_nodes.hpp"
#include "shm/vector_collectives.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>
#include <nodal/detail/wait_record.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nodal::detail {
namespace {

/// The two headers describe the same call (the v-variants' own counts differ by design:
/// finish_vector_call checks them against each other).
bool same_call(const CallHeader& a, const CallHeader& b) {
  return a.kind == b.kind && (a.count == b.count || is_vector(a.kind)) && a.dtype == b.dtype && a.root == b.root &&
         a.on_gpu == b.on_gpu && (!is_reduction(a.kind) || a.op == b.op);
}

/// `history` extended by `call` (what its header says: kind, dtype, op where it reduces, root,
/// count but a v-variant's, on_gpu), folded to 32 bits (splitmix64's finaliser). From the call,
/// not its header in shared memory: the same values, read where they are cheapest.
std::uint32_t with_call(std::uint32_t history, const CollCall& call) {
  std::uint64_t x = static_cast<std::uint64_t>(call.kind) | static_cast<std::uint64_t>(call.dtype) << 8 |
                    static_cast<std::uint64_t>(is_reduction(call.kind) ? call.op : ReduceOp::sum) << 16 |
                    static_cast<std::uint64_t>(call.on_gpu) << 24 | static_cast<std::uint64_t>(static_cast<std::uint32_t>(call.root)) << 32;
  x ^= (is_vector(call.kind) ? 0 : call.count) * 0x9e3779b97f4a7c15ULL;
  x ^= static_cast<std::uint64_t>(history) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<std::uint32_t>(x ^ (x >> 32));
}

std::string describe(const CallHeader& h) {
  std::string text = fmt::format("{}(count={}, dtype={}", coll_kind_name(h.kind), h.count, dtype_name(h.dtype));
  if (is_reduction(h.kind)) text += fmt::format(", op={}", reduce_op_name(h.op));
  if (h.root >= 0) text += fmt::format(", root={}", h.root);
  if (h.on_gpu) text += ", on cuda tensors";
  return text + ")";
}

}  // namespace

void run_collective(CommState& comm, const CollCall& call) {
  if (comm.across_nodes) return run_across_nodes(comm, call);
  Call(comm, call).run();
}

void Call::describe_wait(const void* self, std::string& what, std::string& waiting_for) {
  const Call& call = *static_cast<const Call*>(self);
  const CollCall& c = call.call_;
  what = fmt::format("{} #{} on communicator '{}' (", coll_kind_name(c.kind), call.seq_, call.c_.name);
  if (c.kind != CollKind::barrier) {
    what += fmt::format("{} x {} = {}", c.count, dtype_name(c.dtype), format_bytes(c.count * call.esize_));
    if (is_reduction(c.kind)) what += fmt::format(", {}", reduce_op_name(c.op));
    if (c.root >= 0) what += fmt::format(", root {}", call.c_.global_ranks[c.root]);
  }
  what += ")";
  // Job ranks, as the table lists them: a split communicator's member j is global_ranks[j].
  std::vector<int> missing;
  if (call.credit_need_ != 0) {
    for (int j = 0; j < call.n_; ++j) {
      if (j != call.r_ && !call.peer_done(j, call.credit_need_)) missing.push_back(call.c_.global_ranks[j]);
    }
    waiting_for = fmt::format("ranks {} to finish call #{}", fmt::join(missing, ", "), call.credit_need_);
    return;
  }
  for (int j = 0; j < call.n_; ++j) {
    if (j != call.r_ && call.c_.header(j, call.seq_).seq.load(std::memory_order_acquire) < call.seq_) {
      missing.push_back(call.c_.global_ranks[j]);
    }
  }
  waiting_for = missing.empty() ? std::string("the data of ranks that made this call")
                                : fmt::format("ranks {} to make this call", fmt::join(missing, ", "));
}

void Call::run() {
  BlockingCall blocking(&Call::describe_wait, this);
  check_job_alive();
  check_comm_intact(c_);
  seq_ = c_.seq + 1;
  const bool vector = is_vector(call_.kind);
  // Whether the call is small goes by the largest slot contribution of any rank (the same on every
  // rank): only a root's differs from the others' (contribution_bytes), and it is the largest.
  contribution_ = contribution_bytes(call_, n_, r_);
  const std::size_t largest =
      call_.root >= 0 && call_.root != r_ ? contribution_bytes(call_, n_, call_.root) : contribution_;
  const bool small = !vector && takes_small(call_.kind, call_.on_gpu, largest, n_, c_.shared->crowded != 0, c_.config);
  await_credit(vector ? 2 : c_.slot_depth);
  // Staged before the call counts as made: a ShmError here leaves the sequence as it was.
  if (vector) staged_ = stage_vector_call(c_, call_, seq_);
  c_.seq = seq_;
  try {
    if (small && is_rooted(call_.kind)) {
      run_rooted_small();
    } else {
      publish_header(small, true);
      run_lockstep(small);
      // A store per call beyond the small path: no buffer of this call is touched any more (on
      // cuda tensors: the agreement is over; the GPU backend's own protocol covers the data).
      if (!small) publish_done();
    }
  } catch (const UsageError&) {
    // A mismatch or unequal v-counts: every member that takes part throws it too, and touches no
    // buffer. Done, so that a peer leaving this call part-way meanwhile does not wait for me.
    publish_done();
    throw;
  } catch (const std::exception& e) {
    if (job_failed()) throw;  // it ends every member
    mark_comm_broken(c_, call_.kind, seq_, e);  // my peers may wait for flags I will not publish
    leave_part_way(small);
    throw;
  }
}

void Call::leave_part_way(bool small) {
  publish(c_, progress(r_).done, kLeftComm);
  if (small) return;  // a small call's data lies in the slots: peers touch no buffer of mine
  // A peer that has exited (or is a zombie) touches nothing either: without a supervisor to declare
  // the job failed, a dead peer would hold this wait for ever. Looked at once a millisecond.
  std::vector<bool> exited(static_cast<std::size_t>(n_), false);
  auto looked = Clock::now();
  wait_until(
      c_.shared->word,
      [&] {
        const bool look = Clock::now() - looked >= std::chrono::milliseconds(1);
        if (look) looked = Clock::now();
        for (int j = 0; j < n_; ++j) {
          if (j == r_ || c_.header(j, seq_).seq.load(std::memory_order_acquire) < seq_ || peer_done(j, seq_)) continue;
          if (look && !exited[j]) exited[j] = process_exited(progress(j).pid);
          if (!exited[j]) return false;
        }
        return true;
      },
      Deadline{}, "a peer to leave a broken collective");
}

void Call::publish_done() { publish(c_, progress(r_).done, seq_); }

bool Call::peer_done(int j, std::uint64_t need) const {
  if (progress(j).done.load(std::memory_order_acquire) >= need) return true;
  // A header of call k is published once its rank finished k - 1 (lockstep calls publish no `done`:
  // a store per call costs them ~10 % at 4 bytes). The slot of call need + 1 holds that call or a
  // later one once j got that far: one line to read, not every slot.
  return c_.header(j, need + 1).seq.load(std::memory_order_acquire) >= need + 1;
}

void Call::await_credit(std::uint64_t depth) {
  if (seq_ <= depth || n_ == 1) return;
  const std::uint64_t need = seq_ - depth;
  if (c_.known_done >= need) return;
  credit_need_ = need;
  wait_on_comm(
      c_,
      [&] {
        for (int j = 0; j < n_; ++j) {
          if (j != r_ && !peer_done(j, need)) return false;
        }
        return true;
      },
      "collective");
  credit_need_ = 0;
  // As far as the peers' `done` says: a sender that runs ahead then checks again only when it
  // catches up with that.
  std::uint64_t least = std::numeric_limits<std::uint64_t>::max();
  for (int j = 0; j < n_; ++j) {
    if (j != r_) least = std::min(least, progress(j).done.load(std::memory_order_acquire));
  }
  c_.known_done = std::max(need, least);
}

void Call::publish_header(bool small, bool wake) {
  CallHeader& h = c_.header(r_, seq_);
  if (small && contribution_ != 0) {
    if (call_.kind == CollKind::scatter && n_ == 2) {
      // The root's own block stays where it is (run_small copies it from its input): the slot
      // gets the other's block only, at its start (scatter_slot_offset). On 2 ranks of an Intel
      // Xeon 1.1-2x at 128 B-1 KiB and 4-8 KiB (0.8x at 2 KiB); on 4 ranks sharing 2 cores
      // 0.7-0.9x at 512 B-2 KiB, so not there (bench/results/2026-12-02-small-rooted-prefetch.md).
      const std::size_t block = call_.count * esize_;
      const int other = 1 - r_;
      std::memcpy(c_.inline_data(r_, seq_) + scatter_slot_offset(n_, other, block), bytes(call_.input) + other * block,
                  block);
    } else {
      std::memcpy(c_.inline_data(r_, seq_), call_.input, contribution_);
    }
  }
  h.kind = call_.kind;
  h.dtype = call_.dtype;
  h.op = call_.op;
  h.root = call_.root;
  h.count = call_.count;
  if (!small) {  // a small call's data lies where the offsets would
    Arena& arena = *c_.arena;
    const bool vector = is_vector(call_.kind);
    h.in_arena = vector || (call_.input != nullptr && arena.contains(call_.input));
    h.input_offset = vector       ? staged_
                     : h.in_arena ? arena.offset_of(call_.input)
                                  : reinterpret_cast<std::uintptr_t>(call_.input);
    h.out_arena = call_.output != nullptr && arena.contains(call_.output);
    h.output_offset = h.out_arena ? arena.offset_of(call_.output) : reinterpret_cast<std::uintptr_t>(call_.output);
    // The stores I ask for the slices I read, should the call be staged (shm/pipelined_copy.cpp).
    h.staging = static_cast<std::uint8_t>(reads_from_peers(r_) ? c_.staging_stores.choose(call_.kind, call_.count * esize_)
                                                               : StagingMode::cached);
  }
  h.on_gpu = call_.on_gpu;
  h.history = c_.history;
  if (wake) {
    publish(c_, h.seq, seq_);
  } else {
    h.seq.store(seq_, std::memory_order_release);
  }
}

bool Call::matches(const CallHeader& theirs) const {
  const CallHeader& mine = c_.header(r_, seq_);
  return same_call(mine, theirs) && mine.history == theirs.history;
}

int Call::await_headers(int only) {
  int differs = -1;
  int next = 0;  // every header before it has come and agrees
  auto wanted = [&](int j) { return j != r_ && (only < 0 || j == only); };
  auto come = [&](int j) { return c_.header(j, seq_).seq.load(std::memory_order_acquire) >= seq_; };
  auto finished = [&] { return differs >= 0 || next == n_; };
  unsigned tests = 0;
  // One wait per header that comes, as if waiting for each in turn: every wait spins (or yields)
  // afresh before it sleeps. One wait for all of them went to sleep sooner and made allreduce 1.5x
  // slower on 4 ranks sharing 2 cores.
  while (!finished()) {
    const int before = next;
    wait_on_comm(
        c_,
        [&] {
          for (; next < n_; ++next) {
            if (!wanted(next)) continue;
            if (!come(next)) break;
            if (!matches(c_.header(next, seq_))) {
              differs = next;
              return true;
            }
          }
          if (next != before || finished()) return true;
          // A difference already visible further on ends the wait now: the rank still missing may
          // be waiting for a header that never comes (it made another call). Looked for once in
          // 64 tests, to keep the waiting loop light (waiters yield their core to the ranks that
          // work when ranks outnumber cores).
          if (++tests % 64 != 0) return false;
          for (int j = next + 1; j < n_; ++j) {
            if (wanted(j) && come(j) && !matches(c_.header(j, seq_))) {
              differs = j;
              return true;
            }
          }
          return false;
        },
        "collective");
  }
  return differs;
}

void Call::throw_mismatch(int j) {
  const CallHeader& mine = c_.header(r_, seq_);
  const CallHeader& theirs = c_.header(j, seq_);
  const std::uint64_t since = c_.history_since;
  publish_done();  // this rank reads nothing more of the call
  // The slots of this call are simply never read again and the communicator goes on with the next
  // one; what this rank called before is no longer compared.
  c_.history = 0;
  c_.history_since = seq_ + 1;
  if (same_call(mine, theirs)) {
    throw UsageError(fmt::format(
        "collective mismatch on communicator '{}' (call {}): ranks {} and {} both called {}, but their calls since "
        "call {} differ: an earlier broadcast, scatter, gather or reduce did not match on every rank (a small rooted "
        "call is checked only by the ranks that wait for it; the others learn of it at a later call, this one); "
        "every rank must make the same collective calls in the same order",
        c_.name, seq_, r_, j, describe(mine), since));
  }
  throw UsageError(fmt::format(
      "collective mismatch on communicator '{}' (call {}): rank {} called {} but rank {} called {}; every rank must "
      "make the same collective calls in the same order",
      c_.name, seq_, r_, describe(mine), j, describe(theirs)));
}

void Call::run_lockstep(bool small) {
  const int differs = await_headers(-1);
  if (differs >= 0) throw_mismatch(differs);
  // Every member made this very call, and the same calls before it.
  c_.history = 0;
  c_.history_since = seq_ + 1;
  c_.known_done = std::max(c_.known_done, seq_ - 1);
  if (is_vector(call_.kind)) {
    c_.last_algorithm.store("staged", std::memory_order_relaxed);
    finish_vector_call(c_, call_, seq_);
    return;
  }
  if (call_.on_gpu) return;  // agreed: the GPU backend moves the data
  const Algorithm algorithm = small ? Algorithm::small : large_algorithm(call_.kind, call_.count * esize_, n_,
                                                                              all_in_place(), all_in_arena(), cma_usable(),
                                                                              c_.shared->crowded != 0);
  c_.last_algorithm.store(algorithm_name(algorithm), std::memory_order_relaxed);  // a static string: no copy
  if (call_.kind == CollKind::barrier || call_.count == 0) return;
  if (algorithm == Algorithm::small) {
    run_small();
    return;
  }
  // Every header has come, and my own went out before a fence (publish): a member that left this
  // call part-way before I saw it broken here waits for me (leave_part_way). Checked before I touch
  // a peer's buffer, and as late as that.
  check_comm_intact(c_);
  if (algorithm == Algorithm::cma && call_.kind == CollKind::reduce) {
    run_cma_reduce();
    return;
  }
  if (algorithm == Algorithm::cma && call_.kind == CollKind::allreduce) {
    run_cma_allreduce();
    return;
  }
  if (algorithm == Algorithm::cma && call_.kind == CollKind::gather) {
    run_cma_gather();
    return;
  }
  if (algorithm == Algorithm::cma && call_.kind == CollKind::broadcast) {
    run_cma_broadcast();
    return;
  }
  if (algorithm == Algorithm::in_place && call_.kind == CollKind::allreduce) {
    run_push_allreduce();
    return;
  }
  c_.ensure_ring();
  if (algorithm == Algorithm::linear) {
    run_linear_reduce();
    return;
  }
  if (is_reduction(call_.kind)) {
    run_pipelined_reduction(algorithm == Algorithm::in_place);
  } else {
    run_pipelined_copy(algorithm);
  }
}

void Call::run_rooted_small() {
  c_.last_algorithm.store(algorithm_name(Algorithm::small), std::memory_order_relaxed);
  const bool root = r_ == call_.root;
  const bool toward_root = call_.kind == CollKind::gather || call_.kind == CollKind::reduce;
  // One fence (the wake-up of sleeping peers) per call and rank, not two: it costs ~20 % here.
  if (toward_root != root) {
    // A sender (broadcast's and scatter's root, gather's and reduce's others) reads nothing of the
    // call: done before its header goes out, and the header's wake-up covers both.
    progress(r_).done.store(seq_, std::memory_order_release);
    publish_header(true, true);
    // Scatter's root still keeps its own block.
    if (call_.kind == CollKind::scatter && call_.count != 0) run_small();
    c_.history = with_call(c_.history, call_);
    return;
  }
  // A receiver's header is read only when the call does not match (then throw_mismatch wakes the
  // peers) and by a sender waiting for credit (then the `done` below wakes it).
  publish_header(true, false);
  const int differs = await_headers(toward_root ? -1 : call_.root);
  if (differs >= 0) throw_mismatch(differs);
  if (call_.count != 0) run_small();
  c_.history = with_call(c_.history, call_);
  publish_done();
  prefetch_next_slots(toward_root);
}

void Call::prefetch_next_slots(bool toward_root) const {
  // The lines of the next slot this call's part would lie in, should the next call be like it
  // (back to back calls of one size): the header's, and those of the data past its first 32 bytes.
  const std::size_t n = call_.count * esize_;
  const std::size_t first = call_.kind == CollKind::scatter ? scatter_slot_offset(n_, r_, n) : 0;
  const std::size_t from = (kInlineOffset + first) / kCacheLine;
  const std::size_t to = std::min((kInlineOffset + first + n + kCacheLine - 1) / kCacheLine, from + kPrefetchSlotLines);
  for (int j = 0; j < n_; ++j) {
    if (j == r_ || !(toward_root || j == call_.root)) continue;
    const auto* slot = reinterpret_cast<const std::byte*>(&c_.header(j, seq_ + 1));
    __builtin_prefetch(slot, 0);
    for (std::size_t line = std::max<std::size_t>(from, 1); line < to; ++line) __builtin_prefetch(slot + line * kCacheLine, 0);
  }
}

bool Call::all_in_arena() const {
  // In place needs every buffer a peer touches: inputs for all; outputs too when peers write into
  // them (allreduce).
  for (int j = 0; j < n_; ++j) {
    const CallHeader& h = c_.header(j, seq_);
    if (reads_peer_input(j) && !h.in_arena) return false;
    if (call_.kind == CollKind::allreduce && !h.out_arena) return false;
  }
  return true;
}

bool Call::all_in_place() const {
  // From every header, so that every rank picks the same algorithm: one rank in place and
  // another not must not take different paths.
  for (int j = 0; j < n_; ++j) {
    const CallHeader& h = c_.header(j, seq_);
    if (h.input_offset != h.output_offset || h.in_arena != h.out_arena) return false;
  }
  return true;
}

bool Call::reads_peer_input(int j) const {
  switch (call_.kind) {
    case CollKind::broadcast:
    case CollKind::scatter: return j == call_.root;
    default: return true;
  }
}

bool Call::cma_usable() const {
  if (call_.count * esize_ < c_.config.cma_min_bytes) return false;
  for (int j = 0; j < n_; ++j) {
    // cma needs an address in the peer's memory; an arena buffer's header holds an offset (a call
    // whose buffers are partly in the arena is staged).
    const CallHeader& h = c_.header(j, seq_);
    if (reads_peer_input(j) && (c_.progress[j].cma == 0 || h.in_arena)) return false;
    // allreduce's cma reads the peers' outputs, or writes them (shm/cma.cpp). gather's peers write
    // the root's output, which may be in the arena (they copy into it there: run_cma_gather).
    if (call_.kind == CollKind::allreduce && h.out_arena) return false;
  }
  return true;
}

}  // namespace nodal::detail
