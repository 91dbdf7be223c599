// A rank program whose behaviour the tests choose: `rank_program MODE [ARGS...]`.
// Every mode calls nodal::init() (except no_init and threads_before_init's early part) and prints
// "ready <rank> <pid>" once it is a rank, so a test knows which processes to look for.
#include <nodal/nodal.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

void announce(const nodal::Context& ctx) {
  std::printf("ready %d %d\n", ctx.rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
}

int arg_int(int argc, char** argv, int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; }

/// Bytes of `address`'s mapping that other processes map too (smaps Shared_Clean + Shared_Dirty).
long shared_kib_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  auto target = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  long shared = 0;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = target >= lo && target < hi;
      continue;
    }
    if (!inside) continue;
    long kib = 0;
    if (std::sscanf(line.c_str(), "Shared_Clean: %ld kB", &kib) == 1 || std::sscanf(line.c_str(), "Shared_Dirty: %ld kB", &kib) == 1) {
      shared += kib;
    }
  }
  return shared;
}

/// Waits until every rank has reached this point (a file per rank in dir; the runtime's own
/// Barrier comes with the shared arena, and this test must not depend on it).
void file_barrier(const std::string& dir, const std::string& name, const nodal::Context& ctx) {
  std::ofstream(dir + "/" + name + "." + std::to_string(ctx.rank())) << "\n";
  for (int r = 0; r < ctx.world_size(); ++r) {
    while (!std::filesystem::exists(dir + "/" + name + "." + std::to_string(r))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";

  if (mode == "no_init") return 0;
  if (mode == "threads_before_init") {
    std::thread worker([] { std::this_thread::sleep_for(std::chrono::seconds(5)); });
    worker.detach();
    nodal::init();
    return 0;
  }
  if (mode == "zygote_load") {
    // What the zygote loads before init(): a 32 MiB table, built once, and a line in a log.
    const std::size_t bytes = 32u << 20;
    auto* table = static_cast<std::uint32_t*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (std::size_t i = 0; i < bytes / 4; ++i) table[i] = static_cast<std::uint32_t>(i * 2654435761u);
    std::ofstream(argv[2], std::ios::app) << "loaded by pid " << ::getpid() << "\n";
    nodal::Context ctx = nodal::init();
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < bytes / 4; ++i) sum += table[i];
    // Every rank maps the table while any of them looks at smaps: meet before and after.
    std::string dir = std::filesystem::path(argv[2]).parent_path().string();
    file_barrier(dir, "read", ctx);
    long shared = shared_kib_of(table);
    file_barrier(dir, "looked", ctx);
    std::printf("rank %d table %p sum %llu shared_kib %ld\n", ctx.rank(), static_cast<void*>(table),
                static_cast<unsigned long long>(sum), shared);
    return 0;
  }

  // Blocked before init() so a forwarded SIGUSR1 cannot arrive before wait_usr1 waits for it.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  if (mode == "wait_usr1") pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  nodal::Context ctx = nodal::init();
  const int target = arg_int(argc, argv, 2, 0);
  if (mode == "ok") {
    std::printf("rank %d of %d local %d/%d job %s\n", ctx.rank(), ctx.world_size(), ctx.local_rank(),
                ctx.local_world_size(), ctx.job_id().c_str());
    return 0;
  }
  if (mode == "env") {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "NODAL_JOB_ID", "NODAL_CROWDED", "EXTRA_A", "EXTRA_B"}) {
      const char* value = std::getenv(name);
      std::printf("%s=%s\n", name, value ? value : "<unset>");
    }
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    std::printf("cpus=%d\n", CPU_COUNT(&set));
    return 0;
  }
  if (mode == "gpu") {  // what nodalrun --gpus gave this rank
    for (const char* name : {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NODAL_DEVICE", "NODAL_FORKSERVER_DEVICES",
                             "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"}) {
      const char* value = std::getenv(name);
      std::printf("%s=%s\n", name, value ? value : "<unset>");
    }
    std::printf("device=%s\n", nodal::device_name(ctx.device()).c_str());
    return 0;
  }
  if (mode == "spam") {
    // Many lines written in small, unaligned pieces, so a naive relay would interleave them.
    const int lines = arg_int(argc, argv, 2, 2000);
    for (int i = 0; i < lines; ++i) {
      std::string line = "line " + std::to_string(ctx.rank()) + ":" + std::to_string(i) + ":" +
                         std::string(static_cast<std::size_t>(i % 97), static_cast<char>('a' + ctx.rank() % 26)) + "\n";
      for (std::size_t pos = 0; pos < line.size(); pos += 7) {
        std::size_t piece = std::min<std::size_t>(7, line.size() - pos);
        if (::write(STDOUT_FILENO, line.data() + pos, piece) < 0) return 1;
      }
    }
    return 0;
  }
  // Ignore before announcing: a test signals as soon as it reads "ready".
  if (mode == "hang_ignore_term") ::signal(SIGTERM, SIG_IGN);
  if (mode == "hang_ignore_all") {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_IGN);
  }
  announce(ctx);
  if (mode == "exit" || mode == "segv" || mode == "throw" || mode == "eat_memory") {
    if (ctx.rank() != target) sleep_forever();
    // Long enough for every rank to announce itself first, even under ASan on a busy machine.
    std::this_thread::sleep_for(std::chrono::milliseconds(arg_int(argc, argv, 3, 300)));
    std::fprintf(stderr, "rank %d about to fail (%s)\n", ctx.rank(), mode.c_str());
    if (mode == "exit") std::exit(arg_int(argc, argv, 4, 3));
    while (mode == "eat_memory") {  // until the memory cgroup's OOM killer ends it
      auto* block = static_cast<char*>(std::malloc(1 << 20));
      if (!block) return 12;
      std::memset(block, 1, 1 << 20);
    }
    if (mode == "segv") {
      // A real invalid access (not a null store, which UBSan would catch first): a PROT_NONE page.
      void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      *static_cast<volatile int*>(page) = 1;
    }
    throw std::runtime_error("rank " + std::to_string(ctx.rank()) + " gave up: the flux capacitor is empty");
  }
  if (mode == "hang") sleep_forever();
  if (mode == "hang_ignore_term" || mode == "hang_ignore_all") sleep_forever();
  if (mode == "wait_usr1") {
    // Exits 0 once SIGUSR1 arrives (forwarded by nodalrun); announce() ran with it blocked.
    int sig = 0;
    sigwait(&usr1, &sig);
    std::printf("rank %d got %s\n", ctx.rank(), sig == SIGUSR1 ? "SIGUSR1" : "another signal");
    return 0;
  }

  std::fprintf(stderr, "rank_program: unknown mode %s\n", mode.c_str());
  return 64;
}
