// The rank program of the multi-node tests (tests/integration/multinode_test.cpp): nodalrun runs
// it on each "node" under mpirun. MODE: env | kill VICTIM | mismatch | refused | loop.
#include <nodal/communicator.hpp>
#include <nodal/errors.hpp>
#include <nodal/nodal.hpp>

#include <signal.h>

#include <chrono>
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
int env_mode(const nodal::Context& ctx) {
  int launcher_vars = 0;
  for (char** e = environ; *e; ++e) {
    launcher_vars += std::strncmp(*e, "PMIX_", 5) == 0 || std::strncmp(*e, "OMPI_", 5) == 0 || std::strncmp(*e, "PMI_", 4) == 0;
  }
  std::printf("rank=%d world=%d local=%d/%d group=%s/%s node=%s/%s master=%s:%s launcher_vars=%d slurm=%s/%s/%s\n",
              ctx.rank(), ctx.world_size(), ctx.local_rank(), ctx.local_world_size(), env_or("GROUP_RANK", "-"),
              env_or("GROUP_WORLD_SIZE", "-"), env_or("NODAL_NODE_RANK", "-"), env_or("NODAL_NNODES", "-"),
              env_or("MASTER_ADDR", "-"), env_or("MASTER_PORT", "-"), launcher_vars, env_or("SLURM_PROCID", "-"),
              env_or("SLURM_LOCALID", "-"), env_or("SLURM_NTASKS", "-"));
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
int kill_mode(const nodal::Context& ctx, int victim) {
  nodal::Communicator world = ctx.world();
  if (ctx.rank() != victim) ::signal(SIGTERM, SIG_IGN);  // so that PeerFailure, not nodalrun's SIGTERM, ends them
  std::vector<float> in(1 << 18, 1.0f), out(in.size());
  world.barrier();
  const auto start = Clock::now();
  try {
    for (long i = 0;; ++i) {
      if (ctx.rank() == victim && Clock::now() - start > std::chrono::milliseconds(300)) ::raise(SIGKILL);
      world.allreduce(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum);
    }
  } catch (const nodal::PeerFailure& e) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() - 300;
    std::printf("rank %d: PeerFailure %.0f ms after the kill: %s\n", ctx.rank(), ms, e.what());
    return 1;
  }
}

/// Rank 0 allreduces 8 elements, the others 9: every rank must get the same UsageError.
int mismatch_mode(const nodal::Context& ctx) {
  std::vector<float> buf(9, 1.0f);
  try {
    ctx.world().allreduce(buf.data(), buf.data(), ctx.rank() == 0 ? 8 : 9, DType::f32, ReduceOp::sum);
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: UsageError: %s\n", ctx.rank(), e.what());
    return 0;
  }
  std::printf("rank %d: no error\n", ctx.rank());
  return 1;
}

/// What does not run across nodes yet says so, on every rank, and the communicator goes on working.
int refused_mode(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  int refused = 0;
  auto expect_usage = [&](const char* what, auto&& call) {
    try {
      call();
      std::printf("rank %d: %s was not refused\n", ctx.rank(), what);
    } catch (const nodal::UsageError& e) {
      ++refused;
      std::printf("rank %d: %s refused: %s\n", ctx.rank(), what, e.what());
    }
  };
  expect_usage("split", [&] { world.split(0, 0); });
  expect_usage("create_group", [&] { world.create_group({0, 1}); });
  float x = 1;
  expect_usage("send", [&] { world.send(&x, 1, DType::f32, (ctx.rank() + 1) % world.world_size()); });
  world.allreduce(&x, &x, 1, DType::f32, ReduceOp::sum);
  std::printf("rank %d: refused %d of 3, then allreduce %g\n", ctx.rank(), refused, static_cast<double>(x));
  return refused == 3 && x == static_cast<float>(world.world_size()) ? 0 : 1;
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
  if (mode == "kill") return kill_mode(ctx, argc > 2 ? std::atoi(argv[2]) : ctx.world_size() - 1);
  if (mode == "mismatch") return mismatch_mode(ctx);
  if (mode == "refused") return refused_mode(ctx);
  if (mode == "loop") return loop_mode(ctx);
  std::fprintf(stderr, "multinode_program: unknown mode '%s'\n", mode.c_str());
  return 64;
}
