// The rank program of the multi-node tests (tests/integration/multinode_test.cpp): nodalrun runs
// it on each "node" under mpirun. MODE: env | kill VICTIM | p2p_kill VICTIM | p2p_threads | mismatch |
// float_mode | local_groups | loop | p2p_refused_last.
#include <nodal/communicator.hpp>
#include <nodal/detail/float_mode.hpp>
#include <nodal/errors.hpp>
#include <nodal/nodal.hpp>

#include <sched.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using nodal::DType;
using nodal::ReduceOp;
using Clock = std::chrono::steady_clock;

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

/// What nodalrun gave this rank.
/// "0,1": the CPUs this process may run on.
std::string allowed_cpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string text;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) text += (text.empty() ? "" : ",") + std::to_string(cpu);
  }
  return text;
}

int env_mode(const nodal::Context& ctx) {
  int launcher_vars = 0;
  for (char** e = environ; *e; ++e) {
    launcher_vars += std::strncmp(*e, "PMIX_", 5) == 0 || std::strncmp(*e, "OMPI_", 5) == 0 || std::strncmp(*e, "PMI_", 4) == 0;
  }
  std::printf("rank=%d world=%d local=%d/%d group=%s/%s node=%s/%s master=%s:%s cpus=%s launcher_vars=%d slurm=%s/%s/%s\n",
              ctx.rank(), ctx.world_size(), ctx.local_rank(), ctx.local_world_size(), env_or("GROUP_RANK", "-"),
              env_or("GROUP_WORLD_SIZE", "-"), env_or("NODAL_NODE_RANK", "-"), env_or("NODAL_NNODES", "-"),
              env_or("MASTER_ADDR", "-"), env_or("MASTER_PORT", "-"), allowed_cpus().c_str(), launcher_vars,
              env_or("SLURM_PROCID", "-"), env_or("SLURM_LOCALID", "-"), env_or("SLURM_NTASKS", "-"));
  // The world communicator agrees: every rank's global rank, gathered.
  nodal::Communicator world = ctx.world();
  int mine = ctx.rank();
  std::vector<int> all(static_cast<std::size_t>(world.world_size()));
  world.allgather(&mine, all.data(), 1, DType::i32);
  for (int j = 0; j < world.world_size(); ++j) {
    if (all[static_cast<std::size_t>(j)] != j) {
      std::printf("allgather of ranks: position %d holds %d\n", j, all[static_cast<std::size_t>(j)]);
      return 1;
    }
  }
  return 0;
}

/// Allreduces until the job fails: VICTIM SIGKILLs itself after 300 ms; the others report the
/// PeerFailure they get and how long after the kill (the victim's clock is the machine's).
/// `p2p`: VICTIM sends 16 MiB messages to rank 0 instead, which receives them (the kill comes
/// mid-message), and the other ranks wait in a barrier.
int kill_mode(const nodal::Context& ctx, int victim, bool p2p) {
  nodal::Communicator world = ctx.world();
  if (ctx.rank() != victim) ::signal(SIGTERM, SIG_IGN);  // so that PeerFailure, not nodalrun's SIGTERM, ends them
  std::vector<float> in(1 << 18, 1.0f), out(in.size());
  world.barrier();
  const auto start = Clock::now();
  try {
    for (long i = 0;; ++i) {
      if (!p2p) {
        if (ctx.rank() == victim && Clock::now() - start > std::chrono::milliseconds(300)) ::raise(SIGKILL);
        world.allreduce(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum);
      } else if (ctx.rank() == victim) {
        std::thread([start] {
          std::this_thread::sleep_until(start + std::chrono::milliseconds(300));
          ::raise(SIGKILL);
        }).detach();
        std::vector<float> big(std::size_t{4} << 20, 2.0f);
        for (;;) world.send(big.data(), big.size(), DType::f32, 0);
      } else if (ctx.rank() == 0) {
        std::vector<float> big(std::size_t{4} << 20);
        world.recv(big.data(), big.size(), DType::f32, victim);
      } else {
        world.barrier();
      }
    }
  } catch (const nodal::PeerFailure& e) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() - 300;
    std::printf("rank %d: PeerFailure %.0f ms after the kill: %s\n", ctx.rank(), ms, e.what());
    return 1;
  }
}

/// send/recv around the ring on two threads of every rank (one sends to the next rank, one
/// receives from the previous: within and across nodes) while the main thread allreduces: each
/// message's contents and each allreduce checked.
int p2p_threads_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const int n = world.world_size(), r = ctx.rank();
  const std::size_t sizes[] = {1, 300, 70000, 1 << 20};
  constexpr int kMessages = 40;
  std::atomic<int> failures{0};
  auto fill = [](std::vector<std::int32_t>& v, int from, int m) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(from * 1000003 + m * 7919 + static_cast<int>(i));
  };
  std::thread sender([&] {
    for (int m = 0; m < kMessages; ++m) {
      std::vector<std::int32_t> v(sizes[m % 4]);
      fill(v, r, m);
      world.send(v.data(), v.size(), DType::i32, (r + 1) % n, m);
    }
  });
  std::thread receiver([&] {
    const int from = (r + n - 1) % n;
    for (int m = 0; m < kMessages; ++m) {
      std::vector<std::int32_t> got(sizes[m % 4]), want(sizes[m % 4]);
      fill(want, from, m);
      world.recv(got.data(), got.size(), DType::i32, from, m);
      if (got != want) {
        ++failures;
        std::printf("rank %d: message %d from rank %d differs\n", r, m, from);
      }
    }
  });
  for (int i = 0; i < 200; ++i) {
    std::vector<float> x(i % 2 ? 100000 : 3, static_cast<float>(r + i));
    world.allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum);
    const float want = static_cast<float>(n) * static_cast<float>(i) + static_cast<float>(n * (n - 1) / 2);
    if (x.front() != want || x.back() != want) {
      ++failures;
      std::printf("rank %d: allreduce %d gave %g, expected %g\n", r, i, static_cast<double>(x.front()),
                  static_cast<double>(want));
    }
  }
  sender.join();
  receiver.join();
  if (failures == 0) std::printf("rank %d: p2p threads ok\n", r);
  return failures == 0 ? 0 : 1;
}

/// Folded allreduces (200000 f32 = 800 KB per rank: the agents fold them along the nodes) in five
/// floating-point modes of the ranks: default; flushing denormals (FTZ and DAZ, what
/// torch.set_flush_denormal(True) sets); FTZ only; DAZ only; rounding upwards. Each of three sets
/// of values, rank j contributing values[j] (0 beyond 4 ranks), must give the bits of the rank-order
/// fold in that mode, as one node gives: A, whose first partial (ranks 0 and 1, node 0's) is
/// denormal; B, a denormal input on node 0; C, sums that round. Each set differs from the default
/// mode's result in the mode it is for, so a node folding in its own mode fails.
int float_mode_mode(const nodal::Context& ctx) {
#if defined(__x86_64__) || defined(__i386__)
  using nodal::detail::FloatModeScope;
  nodal::Communicator world = ctx.world();
  constexpr std::uint32_t kFtz = 0x8000, kDaz = 0x0040, kUp = 0x4000;
  struct Mode {
    const char* name;
    std::uint32_t bits;
  };
  const Mode modes[] = {{"default", 0}, {"ftz+daz", kFtz | kDaz}, {"ftz", kFtz}, {"daz", kDaz}, {"upward", kUp}};
  struct Values {
    const char* name;
    float v[4];
    std::uint32_t differs_in;  // the mode whose result must differ from the default's
  };
  const Values sets[] = {{"A", {1.5e-38f, -1.4e-38f, 1.4e-38f, 0.0f}, kFtz},
                         {"B", {1e-39f, 1.4e-38f, 0.0f, 0.0f}, kDaz},
                         {"C", {1.0f, 1e-8f, 1e-8f, 0.0f}, kUp}};
  auto value = [](const Values& set, int rank) { return rank < 4 ? set.v[rank] : 0.0f; };
  // The rank-order fold of every rank's value in `bits`, as the reduce kernels fold (volatile: at
  // run time, in that mode).
  auto reference = [&](const Values& set, std::uint32_t bits) {
    const FloatModeScope scope(bits);
    volatile float acc = value(set, 0);
    for (int j = 1; j < ctx.world_size(); ++j) acc = acc + value(set, j);
    return static_cast<float>(acc);
  };
  auto same_bits = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  int failures = 0;
  for (const Values& set : sets) {
    if (same_bits(reference(set, set.differs_in), reference(set, 0))) {
      ++failures;
      std::printf("rank %d: values %s do not tell mode %#x from the default\n", ctx.rank(), set.name, set.differs_in);
    }
    for (const Mode& mode : modes) {
      std::vector<float> x(200000, value(set, ctx.rank()));
      std::string algorithm;
      {
        const FloatModeScope scope(mode.bits);
        world.allreduce(x.data(), x.data(), x.size(), DType::f32, ReduceOp::sum);
        algorithm = world.last_algorithm();
      }
      const float want = reference(set, mode.bits);
      if (!same_bits(x.front(), want) || !same_bits(x.back(), want) || algorithm != "folded_across_nodes") {
        ++failures;
        std::printf("rank %d: values %s, mode %s: %a by %s, expected %a folded\n", ctx.rank(), set.name, mode.name,
                    static_cast<double>(x.front()), algorithm.c_str(), static_cast<double>(want));
      }
    }
  }
  if (failures == 0) std::printf("rank %d: float modes ok\n", ctx.rank());
  return failures == 0 ? 0 : 1;
#else
  std::printf("rank %d: floating-point modes are only carried on x86\n", ctx.rank());
  return 1;
#endif
}

/// Every rank must get the same UsageError, three times, and the world works on after each, small
/// and large: rank 0 allreduces half as many elements as the others, first a small call (4 vs 9
/// elements, one step), then a large one (150000 vs 300000: with a 1 MiB node buffer, 3 steps vs 5,
/// so the ranks must line up again); then node 0's ranks allreduce 2000 elements and node 1's 4000
/// (one step each, data that rides with the descriptions: blocks of two lengths between agents).
int mismatch_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const bool node0 = std::string(env_or("NODAL_NODE_RANK", "0")) == "0";
  struct Case {
    std::size_t mine, others;  // rank 0's count (or node 0's ranks'), the other ranks'
    bool by_node;
  };
  int errors = 0;
  for (Case c : {Case{4, 9, false}, Case{150000, 300000, false}, Case{2000, 4000, true}}) {
    const bool first = c.by_node ? node0 : ctx.rank() == 0;
    const std::size_t count = first ? c.mine : c.others;
    std::vector<float> buf(count, 1.0f);
    try {
      world.allreduce(buf.data(), buf.data(), count, DType::f32, ReduceOp::sum);
      std::printf("rank %d: no error\n", ctx.rank());
    } catch (const nodal::UsageError& e) {
      ++errors;
      std::printf("rank %d: UsageError: %s\n", ctx.rank(), e.what());
    }
    for (std::size_t n : {std::size_t{3}, std::size_t{300001}}) {
      std::vector<float> ones(n, 1.0f);
      world.allreduce(ones.data(), ones.data(), n, DType::f32, ReduceOp::sum);
      if (ones.front() != static_cast<float>(world.world_size()) || ones.back() != ones.front()) {
        std::printf("rank %d: wrong result after the mismatch\n", ctx.rank());
        return 1;
      }
    }
  }
  std::printf("rank %d: %d mismatches, usable after each\n", ctx.rank(), errors);
  return errors == 3 ? 0 : 1;
}

/// Communicators and send/recv within one node of a job that spans nodes (run with 2 or more
/// ranks per node): a split by node (reversed keys), a create_group of the node's ranks, send/recv
/// between its first two ranks, each checked; then the world still works across nodes.
int local_groups_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const int first = ctx.rank() - ctx.local_rank();
  const int local = ctx.local_world_size();
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::printf("rank %d: FAILED %s\n", ctx.rank(), what.c_str());
    }
  };
  // Node k's ranks, keyed in reverse: group rank = local - 1 - local_rank.
  nodal::Communicator node = world.split(first, -ctx.rank());
  check(node.world_size() == local && node.rank() == local - 1 - ctx.local_rank(), "split: size and rank");
  check(node.global_rank(0) == first + local - 1, "split: group rank 0 is the node's last rank");
  std::int64_t sum = ctx.rank();
  node.allreduce(&sum, &sum, 1, DType::i64, ReduceOp::sum);
  check(sum == static_cast<std::int64_t>(local) * first + static_cast<std::int64_t>(local) * (local - 1) / 2,
        "split: allreduce of the global ranks");
  std::vector<int> members(static_cast<std::size_t>(local));
  for (int j = 0; j < local; ++j) members[static_cast<std::size_t>(j)] = first + j;
  nodal::Communicator group = world.create_group(members, "node");
  std::int32_t root_value = group.rank() == 1 ? 1000 + first : -1;
  group.broadcast(&root_value, 1, DType::i32, 1);
  check(root_value == 1000 + first, "create_group: broadcast from group rank 1");
  // send/recv between the node's first two ranks, through the world (global ranks).
  std::vector<float> message(70000);
  if (ctx.local_rank() == 0) {
    for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<float>(i % 1000) + static_cast<float>(first);
    world.send(message.data(), message.size(), DType::f32, first + 1);
  } else if (ctx.local_rank() == 1) {
    world.recv(message.data(), message.size(), DType::f32, first);
    bool same = true;
    for (std::size_t i = 0; i < message.size(); ++i) same &= message[i] == static_cast<float>(i % 1000) + static_cast<float>(first);
    check(same, "send/recv within the node");
  }
  float x = 1;
  world.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum);
  check(x == static_cast<float>(world.world_size()), "world allreduce afterwards");
  if (failures == 0) std::printf("rank %d: local groups ok\n", ctx.rank());
  return failures == 0 ? 0 : 1;
}

/// The last rank sends 200 KiB of f32 to rank 0, which receives i32: a one-chunk message (above
/// Open MPI's 64 KiB eager limit over TCP, so its send completes only once received), which
/// crosses nodes beside its header before rank 0 refuses it. Both ranks catch the UsageError and
/// end at once: the agents must still drain the message, so that the job ends cleanly.
int p2p_refused_last_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const int last = ctx.world_size() - 1;
  std::vector<float> message(51200, 1.0F);
  try {
    if (ctx.rank() == last) world.send(message.data(), message.size(), DType::f32, 0);
    if (ctx.rank() == 0) world.recv(message.data(), message.size(), DType::i32, last);
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: refused: %s\n", ctx.rank(), e.what());
  }
  return 0;
}

/// Allreduces until PeerFailure (a node lost), reporting it.
int loop_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  ::signal(SIGTERM, SIG_IGN);
  float x = 1;
  world.barrier();
  std::printf("rank %d: looping\n", ctx.rank());
  std::fflush(stdout);
  const auto start = Clock::now();
  try {
    for (;;) {
      world.allreduce(&x, &x, 1, DType::f32, ReduceOp::max);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const nodal::PeerFailure& e) {
    std::printf("rank %d: PeerFailure after %.1f s: %s\n", ctx.rank(),
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  nodal::Context ctx = nodal::init();
  if (mode == "env") return env_mode(ctx);
  if (mode == "kill" || mode == "p2p_kill") {
    return kill_mode(ctx, argc > 2 ? std::atoi(argv[2]) : ctx.world_size() - 1, mode == "p2p_kill");
  }
  if (mode == "p2p_threads") return p2p_threads_mode(ctx);
  if (mode == "mismatch") return mismatch_mode(ctx);
  if (mode == "float_mode") return float_mode_mode(ctx);
  if (mode == "local_groups") return local_groups_mode(ctx);
  if (mode == "loop") return loop_mode(ctx);
  if (mode == "p2p_refused_last") return p2p_refused_last_mode(ctx);
  std::fprintf(stderr, "multinode_program: unknown mode '%s'\n", mode.c_str());
  return 64;
}
