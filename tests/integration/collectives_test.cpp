// Collectives under nodalrun: every collective x op x dtype x size x variant against coll_program's
// independent reference, at world sizes 1, 2, 3, 4 and 8 (oversubscribed on a 2-core machine);
// algorithm overrides, 100k back-to-back small allreduces, sub-communicators, send/recv, and
// mismatched arguments (UsageError on every rank, the communicator usable afterwards).
// coll_program exits 1 with a "FAIL rank R: ..." line naming the first wrong element.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nodal/communicator.hpp>

#include "../support/child_process.hpp"
#include "../support/cma.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// nodalrun -n N --timeout T [nodalrun_options] coll_program args...: a hang ends as exit code 124.
ChildResult run_coll(int n, const std::vector<std::string>& args, std::vector<std::string> nodalrun_options = {},
                     int timeout_s = 240) {
  std::vector<std::string> argv = {"-n", std::to_string(n), "--timeout", std::to_string(timeout_s)};
  argv.insert(argv.end(), nodalrun_options.begin(), nodalrun_options.end());
  argv.push_back(kCollProgram);
  argv.insert(argv.end(), args.begin(), args.end());
  return run(nodalrun_command(argv), std::chrono::seconds(timeout_s + 30));
}

/// What a rank's matrix summary line says.
struct Summary {
  int checks = 0;
  std::string digest;
  std::map<std::string, int> algorithms;  ///< "private:small" -> calls, allreduce with count > 0 only
};

/// rank -> summary, from "[r] rank R ... ok N checks digest D algorithms A in T ms" lines.
std::map<int, Summary> summaries(const std::string& out) {
  static const std::regex line(
      R"(\[(\d+)\] rank (\d+)\b.* ok (\d+) checks digest ([0-9a-f]+) algorithms (\S+) in \d+ ms)");
  std::map<int, Summary> result;
  for (const std::string& l : lines_of(out)) {
    std::smatch m;
    if (!std::regex_match(l, m, line) || m[1] != m[2]) continue;
    Summary s{std::stoi(m[3]), m[4], {}};
    if (m[5] != "-") {
      std::stringstream items(m[5]);
      std::string item;
      while (std::getline(items, item, ',')) {
        auto eq = item.find('=');
        s.algorithms[item.substr(0, eq)] = std::stoi(item.substr(eq + 1));
      }
    }
    result[std::stoi(m[1])] = s;
  }
  return result;
}

/// The job succeeded and every one of its n ranks reported the same positive number of checks.
void expect_all_ranks_ok(const ChildResult& r, int n) {
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto s = summaries(r.out);
  ASSERT_EQ(s.size(), static_cast<std::size_t>(n)) << r.out;
  for (const auto& [rank, summary] : s) {
    EXPECT_GT(summary.checks, 0) << "rank " << rank;
    EXPECT_EQ(summary.checks, s.begin()->second.checks) << "rank " << rank << " ran another number of checks";
  }
}

/// Every rank's algorithms, summed.
std::map<std::string, int> algorithms_used(const std::string& out) {
  std::map<std::string, int> total;
  for (const auto& [rank, summary] : summaries(out)) {
    for (const auto& [name, calls] : summary.algorithms) total[name] += calls;
  }
  return total;
}

std::string describe(const std::map<std::string, int>& algorithms) {
  std::string s;
  for (const auto& [name, calls] : algorithms) s += name + "=" + std::to_string(calls) + " ";
  return s;
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, EveryCollectiveOpDtypeAndVariantAtSizes0And1And7And4097) {
  // 4097 elements: small for 1-byte dtypes, past the 16 KiB small-path limit for 4- and 8-byte ones.
  ChildResult r = run_coll(GetParam(), {"matrix", "sizes=0,1,7,4097"});
  expect_all_ranks_ok(r, GetParam());
}

TEST_P(WorldSize, EveryOpAndDtypeAtAMillionAndThreeElements) {
  int n = GetParam();
  // Oversubscribed (8 ranks on 2 cores) and alone (nothing to combine): the dtypes that differ most
  // (wrapping bytes, f16/bf16 rounding, f64), to keep the run short.
  std::string dtypes = n == 1 || n >= 8 ? "dtypes=i8,i32,f16,bf16,f64" : "dtypes=all";
  // Variants take turns (rotate=1) and a vector collective's whole buffer is the size (total=1),
  // so that each rank's share of the checking stays the same at every world size.
  ChildResult r = run_coll(
      n, {"matrix", "sizes=1000003", dtypes, "variants=raw/out/private,tensor/in/shared", "rotate=1", "total=1"},
      {"--shm-size", "2G"});
  expect_all_ranks_ok(r, n);
}

TEST_P(WorldSize, SubCommunicatorsRunCollectivesConcurrently) {
  int n = GetParam();
  ChildResult r = run_coll(n, {"split", "sizes=0,1,7,4097", "variants=raw/out/private,tensor/in/shared,raw/in/shared"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(contains(r.out, "[" + std::to_string(rank) + "] rank " + std::to_string(rank) + " split ok")) << r.out;
  }
  // One summary per rank, from its group of color rank % 3; the group's ranks agree on the checks.
  auto s = summaries(r.out);
  EXPECT_EQ(s.size(), static_cast<std::size_t>(n)) << r.out;
  for (const auto& [rank, summary] : s) EXPECT_EQ(summary.checks, s.begin()->second.checks) << rank;
}

INSTANTIATE_TEST_SUITE_P(Collectives, WorldSize, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& p) { return "n" + std::to_string(p.param); });

class SixtyFourMiB : public ::testing::TestWithParam<int> {};

TEST_P(SixtyFourMiB, AllreduceOf64MiBPerRank) {
  int n = GetParam();
  // Four (op, dtype) pairs, the variants taking turns: private buffers (pipelined) and arena ones (in_place).
  ChildResult r = run_coll(n,
                           {"matrix", "sizes=64MiB", "colls=allreduce", "pairs=sum:f32,avg:bf16,max:i8,prod:f64",
                            "variants=raw/out/private,tensor/in/shared,raw/in/private", "rotate=1"},
                           {"--shm-size", "4G"});
  expect_all_ranks_ok(r, n);
  auto algorithms = algorithms_used(r.out);
  EXPECT_GT(algorithms["shared:in_place"], 0) << describe(algorithms);
  EXPECT_GT(algorithms["private:pipelined"], 0) << describe(algorithms);
}

INSTANTIATE_TEST_SUITE_P(Collectives, SixtyFourMiB, ::testing::Values(2, 4),
                         [](const auto& p) { return "n" + std::to_string(p.param); });

TEST(Collectives, AllreduceOfArenaBuffersWritesEveryBlockIntoEveryOutput) {
  // The in_place algorithm's allreduce (shm/push_allreduce.cpp): each block's owner writes it
  // into every output. 3 ranks, so blocks are uneven and end mid-step; 4.4 MB of f32 and 8.8 MB
  // of i64 out of place take the streaming stores, in place the plain ones; every element of
  // every output checked against the reference, inputs unchanged when out of place.
  ChildResult r = run_coll(3,
                           {"matrix", "colls=allreduce", "sizes=8209,100003,1100003", "dtypes=f32,i64,bf16", "seed=11",
                            "variants=tensor/out/shared,tensor/in/shared,raw/in/shared"},
                           {"--shm-size", "2G"});
  expect_all_ranks_ok(r, 3);
  auto algorithms = algorithms_used(r.out);
  EXPECT_GT(algorithms["shared:in_place"], 0) << describe(algorithms);
  for (const auto& [name, calls] : algorithms) {
    EXPECT_TRUE(name == "shared:in_place") << name << " in " << describe(algorithms);
  }
}

/// NODAL_* overrides: every algorithm must give the reference's bits (coll_program checks every
/// element against it, so runs that pass agree with each other bit for bit), and the override must
/// have taken effect.
struct Override {
  std::string name;
  std::vector<std::string> env;  ///< NAME=VALUE, exported with nodalrun -x
};

void PrintTo(const Override& o, std::ostream* os) { *os << o.name; }

class AlgorithmOverride : public ::testing::TestWithParam<Override> {};

TEST_P(AlgorithmOverride, GivesTheReferenceBits) {
  const int n = 3;
  std::vector<std::string> options = {"--shm-size", "2G"};
  for (const std::string& e : GetParam().env) options.insert(options.end(), {"-x", e});
  ChildResult r =
      run_coll(n,
               {"matrix", "colls=allreduce", "sizes=0,1,7,4097,100003,1000003", "dtypes=i8,i64,f16,f32", "seed=7",
                "rotate=1", "variants=raw/out/private,raw/in/shared,tensor/out/shared,tensor/in/private"},
               options);
  expect_all_ranks_ok(r, n);
  auto algorithms = algorithms_used(r.out);
  auto only = [&](const std::string& prefix, const std::set<std::string>& allowed) {
    for (const auto& [name, calls] : algorithms) {
      if (name.rfind(prefix, 0) == 0) {
        EXPECT_TRUE(allowed.count(name)) << name << " in " << describe(algorithms);
      }
    }
  };
  const std::string& name = GetParam().name;
  if (name == "default" || name == "auto") {
    EXPECT_GT(algorithms["private:small"], 0) << describe(algorithms);
    EXPECT_GT(algorithms["private:pipelined"], 0) << describe(algorithms);
    EXPECT_GT(algorithms["shared:in_place"], 0) << describe(algorithms);
    EXPECT_EQ(algorithms.count("private:in_place"), 0u) << describe(algorithms);
  } else if (name == "small" || name == "small_max_8M") {
    only("", {"private:small", "shared:small"});
  } else if (name == "pipelined") {
    only("", {"private:pipelined", "shared:pipelined"});
  } else if (name == "in_place") {
    only("shared:", {"shared:in_place"});
    EXPECT_EQ(algorithms.count("private:in_place"), 0u)
        << "private buffers cannot be read in place: " << describe(algorithms);
  } else if (name == "small_max_0") {
    EXPECT_EQ(algorithms.count("private:small") + algorithms.count("shared:small"), 0u) << describe(algorithms);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Collectives, AlgorithmOverride,
    ::testing::Values(Override{"default", {}}, Override{"auto", {"NODAL_ALLREDUCE_ALGO=auto"}},
                      // The small path needs the message in a slot: forcing it takes slots that large.
                      Override{"small", {"NODAL_ALLREDUCE_ALGO=small", "NODAL_SMALL_MAX_BYTES=8M"}},
                      // As if every rank had a core (NODAL_CROWDED=0), so that messages of one ring
                      // entry (1000003 i8, 100003 i64) take two steps (Call::pipeline_step).
                      Override{"pipelined", {"NODAL_ALLREDUCE_ALGO=pipelined", "NODAL_CROWDED=0"}},
                      Override{"in_place", {"NODAL_ALLREDUCE_ALGO=in_place"}},
                      Override{"small_max_0", {"NODAL_SMALL_MAX_BYTES=0"}},
                      Override{"small_max_8M", {"NODAL_SMALL_MAX_BYTES=8M"}},
                      Override{"chunk_4K", {"NODAL_CHUNK_BYTES=4K"}},
                      // Not a multiple of any block size: uneven blocks and a short last chunk.
                      Override{"chunk_4100_pipelined", {"NODAL_CHUNK_BYTES=4100", "NODAL_ALLREDUCE_ALGO=pipelined"}},
                      Override{"chunk_64M_in_place", {"NODAL_CHUNK_BYTES=64M", "NODAL_ALLREDUCE_ALGO=in_place"}},
                      // The header's own example of a size: "2Mi".
                      Override{"chunk_2Mi", {"NODAL_CHUNK_BYTES=2Mi"}}),
    [](const auto& p) { return p.param.name; });

/// The copy collectives' large-message paths for private buffers: cross-memory attach (one
/// process_vm_readv per peer, the default where the kernel allows it) and staging through the ring
/// (NODAL_CMA=0, what machines with Yama's ptrace_scope >= 2 get), its slices written with the
/// stores chosen per call (shm/staging_stores.hpp) or with streaming stores every time
/// (staged_streaming: NODAL_STAGING_STORES=streaming; the tails of slices that are not whole
/// 64-byte rounds take copy_bytes' memcpy), or by rank (staged_mixed: a slice several ranks read
/// is streamed if any asks, the others as their reader asks).
class CopyPath : public ::testing::TestWithParam<std::string> {};

TEST_P(CopyPath, GivesTheReferenceBits) {
  const int n = 3;
  const bool cma = GetParam() == "cma";
  if (cma && !kernel_allows_cma()) {
    GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": the kernel forbids process_vm_readv "
                 << "between sibling ranks, so nodal stages copies (the 'staged' case covers that path)";
  }
  // NODAL_CROWDED=0: as if every rank had a core, so that staged messages of one ring entry take
  // two steps (Call::pipeline_step) on any machine (1000003 i8 and 100003 f64; 40003 f64 for
  // scatter's and alltoall's slices). Ranks then spin without yielding: slower on 2 cores, not wrong.
  std::vector<std::string> options = {"--shm-size", "2G", "-x", cma ? "NODAL_CMA=1" : "NODAL_CMA=0", "-x",
                                      "NODAL_CROWDED=0"};
  if (GetParam() == "staged_streaming") options.insert(options.end(), {"-x", "NODAL_STAGING_STORES=streaming"});
  std::vector<std::string> args = {"matrix", "colls=broadcast,allgather,gather,scatter,alltoall",
                                   cma ? "sizes=20003,65531" : "sizes=40003,100003,1000003", "dtypes=i8,f16,f64",
                                   "variants=raw/out/private,tensor/out/private,tensor/in/shared"};
  // Readers asking for different stores in one call: rank 1 streaming, ranks 0 and 2 cached. So
  // rank 1's slices of allgather are cached (no other reader asks), the others' streamed (rank 1
  // does); ranks 0 and 2 read both kinds in one call; broadcast's slice is cached from root 1.
  if (GetParam() == "staged_mixed") args.push_back("staging_by_rank=cached:streaming:cached");
  ChildResult r = run_coll(n, args, options);
  // cma: all from 16 KiB (NODAL_CMA_MIN_BYTES) below 512 KiB per rank (cma_copy_end_bytes); staged: up to 8 MB, one to many chunks
  // through the ring.
  expect_all_ranks_ok(r, n);
  auto algorithms = algorithms_used(r.out);
  EXPECT_GT(algorithms[cma ? "private:cma" : "private:pipelined"], 0) << describe(algorithms);
  EXPECT_EQ(algorithms.count(cma ? "private:pipelined" : "private:cma"), 0u) << describe(algorithms);
  EXPECT_GT(algorithms["shared:in_place"], 0) << describe(algorithms);
}

INSTANTIATE_TEST_SUITE_P(Collectives, CopyPath, ::testing::Values("cma", "staged", "staged_streaming", "staged_mixed"),
                         [](const auto& p) { return p.param; });

/// Whether /proc/cpuinfo names Intel as the vendor: the copy collectives' cma ends depend on it
/// (algorithm_table.hpp, cma_copy_end_bytes).
bool intel_processor() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string info((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
  return info.find("GenuineIntel") != std::string::npos;
}

TEST(Collectives, RootedCallsTakeTheSmallPathFurtherOnTwoToFourCrowdedRanks) {
  // shm/algorithm_table.hpp small_max_bytes: a call is small while its largest slot contribution
  // (a scatter root's but on 2 ranks, every alltoall and reduce_scatter rank's: world_size messages) is within
  // 16 KiB, except where ranks outnumber cores: on 2-4 ranks broadcast and scatter up to 64 KiB,
  // on 4 ranks reduce up to 32 KiB. Private buffers in place and out: allreduce, reduce, allgather and reduce_scatter
  // 2 calls per size, broadcast, gather, scatter and alltoall 1; every result checked.
  struct Case {
    int n;
    bool crowded;
    int small;  // small calls per rank of the 48 at 8, 16, 32 and 64 KiB
  };
  for (const Case& c : {
           // broadcast 4, scatter 2 (8-16 KiB: 3-4 blocks within 64 KiB), reduce 6 on 4 ranks
           // (8-32 KiB), 4 on 3 (8-16 KiB), allgather, gather and allreduce at 8-16 KiB 4, 2 and 4.
           Case{3, true, 20},
           Case{4, true, 22},
           // 16 KiB for every op: broadcast 2, reduce 4, allgather 4, gather 2, allreduce 4.
           Case{4, false, 16},
           // The same on 2 ranks, and reduce_scatter 2 and alltoall 1 (8 KiB: 2 blocks within
           // 16 KiB), scatter 2 (8-16 KiB: the root's slot holds the other rank's block alone,
           // scatter_slot_offset).
           Case{2, false, 21},
           // 2 crowded ranks: broadcast and scatter to 64 KiB (4 each: scatter's root slot holds
           // one block), reduce to 16 KiB as the others (4, as allreduce and allgather; gather 2,
           // reduce_scatter 2, alltoall 1).
           Case{2, true, 25},
       }) {
    ChildResult r = run_coll(c.n,
                             {"matrix", "colls=all", "sizes=8192B,16384B,32768B,65536B", "dtypes=f32", "ops=sum",
                              "variants=raw/in/private,raw/out/private"},
                             {"-x", c.crowded ? "NODAL_CROWDED=1" : "NODAL_CROWDED=0"});
    expect_all_ranks_ok(r, c.n);
    auto algorithms = algorithms_used(r.out);
    const std::string where = std::to_string(c.n) + " ranks, crowded " + std::to_string(c.crowded) + ": ";
    EXPECT_EQ(algorithms["private:small"], c.n * c.small) << where << describe(algorithms);
    int total = 0;
    for (const auto& [name, calls] : algorithms) total += calls;
    EXPECT_EQ(total, c.n * 48) << where << describe(algorithms);
  }
}

TEST(Collectives, CopyCollectivesTakeCmaOnLargeMessagesOnlyWhenRanksOutnumberCores) {
  // 3 ranks, private buffers, 512 KiB - 32 B, 1 MiB - 32 B, 1.5 MiB, 4 MB and 16 MiB + 400 B of
  // f32 per rank. While every rank has a core (algorithm_table.hpp, cma_copy_end_bytes), on AMD and
  // other processors: cma below 512 KiB; from 512 KiB allgather, gather and alltoall take the
  // pipelined path, from 1 MiB scatter too, from 2 MiB broadcast. On Intel's: allgather and
  // alltoall below 16 MiB, broadcast, gather and scatter at every size. When ranks outnumber
  // cores: cma at every size. Both cases on any machine: NODAL_CROWDED (nodalrun's verdict,
  // Launcher.TheNodeIsCrowdedWhen...) given with -x.
  if (!kernel_allows_cma()) GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": no cma here";
  const int n = 3;
  const bool intel = intel_processor();
  for (bool crowded : {false, true}) {
    ChildResult r = run_coll(n,
                             {"matrix", "colls=broadcast,allgather,gather,scatter,alltoall",
                              "sizes=131064,262136,393216,1000003,4194404", "dtypes=f32",
                              "variants=raw/in/private,raw/out/private"},
                             {"--shm-size", "1G", "-x", "NODAL_CMA=1", "-x", crowded ? "NODAL_CROWDED=1" : "NODAL_CROWDED=0"});
    expect_all_ranks_ok(r, n);
    auto algorithms = algorithms_used(r.out);
    // Per rank and size, 6 calls: broadcast (in place only), allgather both ways, gather, scatter
    // and alltoall out of place. Not crowded, elsewhere: all 6 cma at 512 KiB - 32 B; at 1 MiB - 32 B
    // broadcast and scatter cma, the other 4 pipelined; at 1.5 MiB broadcast cma, the other 5
    // pipelined; at 4 MB and 16 MiB all 6 pipelined: 9 cma, 21 pipelined. On Intel: all 6 cma at
    // the first four sizes; at 16 MiB broadcast, gather and scatter cma, the other 3 pipelined:
    // 27 cma, 3 pipelined.
    const int cma = crowded ? 30 : intel ? 27 : 9;
    const std::string where = "crowded " + std::to_string(crowded) + ", intel " + std::to_string(intel) + ": ";
    EXPECT_EQ(algorithms["private:cma"], n * cma) << where << describe(algorithms);
    EXPECT_EQ(algorithms["private:pipelined"], n * (30 - cma)) << where << describe(algorithms);
  }
}

TEST(Collectives, GatherPeersWriteIntoTheRootsOutputWhereverItIs) {
  // shm/cma.cpp run_cma_gather: 3 ranks, private inputs of 78 KiB (cma's range whether or not
  // ranks outnumber cores), every rank the root in turn, its output private (the peers write it
  // with process_vm_writev) or in the arena (they copy into it); every element checked, and the
  // 64 after the output. A count that differs on one rank is a UsageError on every rank before
  // anything is written into the root's output.
  if (!kernel_allows_cma()) GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": no cma here";
  const int n = 3;
  for (bool crowded : {false, true}) {
    ChildResult r = run_coll(n, {"gather_places"},
                             {"-x", "NODAL_CMA=1", "-x", crowded ? "NODAL_CROWDED=1" : "NODAL_CROWDED=0"});
    ASSERT_FALSE(r.timed_out);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    // Every root with both outputs, then the call after the mismatch: cma on every rank.
    EXPECT_EQ(count_lines(r.out, R"(gather_places root [0-2] (private|arena) match ok \(cma\))"), n * (n * 2 + 1))
        << "crowded " << crowded << ": " << r.out;
    EXPECT_EQ(count_lines(r.out, R"(gather_places root 0 private mismatch ok \(refused\))"), n)
        << "crowded " << crowded << ": " << r.out;
  }
}

TEST(Collectives, ReduceIntoARootsOutputWhereverItIs) {
  // reduce of private inputs, every root in turn, its output private or in the arena: while every
  // rank has a core and (world_size - 1) x size <= 256 KiB the root reads the inputs (cma,
  // shm/cma.cpp run_cma_reduce), when ranks outnumber cores the peers stage (linear). 3 ranks,
  // 80 KB (cma or linear) and 400 KB (beyond both: pipelined); every element and the 64 after the
  // message checked on the root.
  if (!kernel_allows_cma()) GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": no cma here";
  const int n = 3;
  for (bool crowded : {false, true}) {
    ChildResult r = run_coll(n, {"reduce_places"},
                             {"--shm-size", "1G", "-x", "NODAL_CMA=1", "-x", crowded ? "NODAL_CROWDED=1" : "NODAL_CROWDED=0"});
    ASSERT_FALSE(r.timed_out);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string where = "crowded " + std::to_string(crowded) + ": ";
    const std::string small = crowded ? "linear" : "cma";
    EXPECT_EQ(count_lines(r.out, R"(reduce_places root [0-2] (private|arena) 20011 ok \()" + small + R"(\))"), n * n * 2)
        << where << r.out;
    EXPECT_EQ(count_lines(r.out, R"(reduce_places root [0-2] (private|arena) 100003 ok \(pipelined\))"), n * n * 2)
        << where << r.out;
  }
}

TEST(Collectives, BroadcastRootWritesItsShareIntoTheReceiversWhereverTheirBuffersAre) {
  // shm/cma.cpp run_cma_broadcast: the receivers read all but the last block of the root's private
  // buffer and the root writes that block into theirs (with process_vm_writev, or a copy into the
  // arena), and a receiver that forbids cma reads it all. 3 ranks, every root, 80 KB (cma's range
  // everywhere) and 4 MB (cma when ranks outnumber cores or on Intel), with a core each and not;
  // every element and the 64 after the message checked.
  if (!kernel_allows_cma()) GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": no cma here";
  const int n = 3;
  for (bool crowded : {false, true}) {
    ChildResult r = run_coll(n, {"broadcast_places"},
                             {"--shm-size", "1G", "-x", "NODAL_CMA=1", "-x", crowded ? "NODAL_CROWDED=1" : "NODAL_CROWDED=0"});
    ASSERT_FALSE(r.timed_out);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string where = "crowded " + std::to_string(crowded) + ": ";
    EXPECT_EQ(count_lines(r.out, R"(broadcast_places root [0-2] (private|arena|no_cma) 20011 ok \(cma\))"), n * n * 3)
        << where << r.out;
    EXPECT_EQ(count_lines(r.out, R"(broadcast_places root [0-2] (private|arena|no_cma) 1000003 ok \((cma|pipelined)\))"),
              n * n * 3)
        << where << r.out;
  }
}

TEST(Collectives, ReduceOfPrivateBuffersFoldsWhileThePeersStage) {
  // The linear path (shm/linear_reduce.cpp): 2 ranks, each with a core (NODAL_CROWDED=0), private
  // buffers, beyond cma's range up to 8 MiB. The root folds 16 KiB segments out of the peer's ring
  // as they are staged: 300007 and 3000017 elements are many segments (the 2 MiB ring wraps at
  // 3000017 i8 and bf16; the end of the test wraps a tiny one), and a short last segment; roots alternate, the root's input is its output in the
  // tensor/in variant. 3000017 f32 and i64 (12 and 24 MB) are pipelined. With NODAL_CMA=0 the
  // linear path also takes 8209 f32, bf16 and i64 (32 KiB-64 KiB), where cma would.
  const bool cma_allowed = kernel_allows_cma();  // else only the NODAL_CMA=0 half
  for (const bool cma : {true, false}) {
    if (cma && !cma_allowed) continue;
    ChildResult r = run_coll(2,
                             {"matrix", "colls=reduce", "sizes=8209,300007,3000017",
                              "pairs=sum:f32,max:i8,avg:bf16,prod:i64,min:f64", "seed=5",
                              "variants=raw/out/private,tensor/in/private"},
                             {"--shm-size", "1G", "-x", cma ? "NODAL_CMA=1" : "NODAL_CMA=0", "-x", "NODAL_CROWDED=0"});
    expect_all_ranks_ok(r, 2);
    auto algorithms = algorithms_used(r.out);
    // Per rank and variant: 300007 of every dtype and 3000017 of i8, bf16 (linear); 3000017 of
    // f32, i64, f64 (pipelined); 8209: i8 small, the others cma (or linear without cma; f64
    // 64 KiB).
    const int variants = 2;
    EXPECT_EQ(algorithms["private:linear"], 2 * variants * (7 + (cma ? 0 : 4))) << "cma " << cma << ": "
                                                                                 << describe(algorithms);
    EXPECT_EQ(algorithms["private:pipelined"], 2 * variants * 3) << describe(algorithms);
    EXPECT_EQ(algorithms["private:cma"], cma ? 2 * variants * 4 : 0) << describe(algorithms);
  }
  // Where ranks outnumber cores (NODAL_CROWDED=1) the root also folds as the peers stage while
  // (world_size - 1) x size <= 256 KiB: 3 ranks, 8209 f32, bf16, i64 and f64 (32-64 KiB: linear,
  // even with cma allowed), 300007 (pipelined); 4 ranks, 20011 bf16 (39 KiB) and f64 (156 KiB:
  // pipelined).
  ChildResult crowded = run_coll(3,
                                 {"matrix", "colls=reduce", "sizes=8209,300007",
                                  "pairs=sum:f32,max:i8,avg:bf16,prod:i64,min:f64", "seed=6",
                                  "variants=raw/out/private,tensor/in/private"},
                                 {"--shm-size", "1G", "-x", "NODAL_CROWDED=1"});
  expect_all_ranks_ok(crowded, 3);
  auto algorithms = algorithms_used(crowded.out);
  EXPECT_EQ(algorithms["private:linear"], 3 * 2 * 4) << describe(algorithms);
  EXPECT_EQ(algorithms["private:pipelined"], 3 * 2 * 5) << describe(algorithms);
  ChildResult four = run_coll(4, {"matrix", "colls=reduce", "sizes=20011", "pairs=sum:bf16,max:f64", "seed=8",
                                  "variants=raw/out/private"},
                              {"--shm-size", "1G", "-x", "NODAL_CROWDED=1"});
  expect_all_ranks_ok(four, 4);
  algorithms = algorithms_used(four.out);
  EXPECT_EQ(algorithms["private:linear"], 4) << describe(algorithms);
  EXPECT_EQ(algorithms["private:pipelined"], 4) << describe(algorithms);
  // The smallest ring (NODAL_CHUNK_BYTES=4096: two 4 KiB segments per rank), so that the peers
  // wait for the root at every other segment: 2 ranks, 300007 f32 and bf16 (293 and 147
  // segments); 3 ranks on 2 cores, 8209 f32 (9 segments each).
  for (const int n : {2, 3}) {
    ChildResult tiny = run_coll(n,
                                {"matrix", "colls=reduce", n == 2 ? "sizes=300007" : "sizes=8209",
                                 "pairs=sum:f32,avg:bf16", "seed=9", "variants=raw/out/private,tensor/in/private"},
                                {"--shm-size", "1G", "-x", "NODAL_CHUNK_BYTES=4096", "-x", "NODAL_CMA=0", "-x",
                                 n == 2 ? "NODAL_CROWDED=0" : "NODAL_CROWDED=1"});
    expect_all_ranks_ok(tiny, n);
    algorithms = algorithms_used(tiny.out);
    EXPECT_EQ(algorithms["private:linear"], n * 2 * 2) << n << " ranks: " << describe(algorithms);
  }
}

TEST(Collectives, TwoRankAllreduceOfPrivateBuffersReadsPeersInSegments) {
  // 2 ranks, private buffers: cma from 1 MiB, in 8 MiB segments (20 MB: two whole segments and a
  // short one, blocks not a multiple of a cache line); out of place it stops below 32 MiB (40 MB
  // i64 out of place is pipelined), in place it goes on to 64 MiB, from 8 MiB writing each reduced
  // step into the peer's output (20 MB f32 and 40 MB i64 in place: blocks end mid-step).
  if (!kernel_allows_cma()) GTEST_SKIP() << "Yama ptrace_scope is " << yama_ptrace_scope() << ": no cma here";
  ChildResult r = run_coll(2,
                           {"matrix", "colls=allreduce", "sizes=262147,5000003", "dtypes=f32,i64", "seed=3",
                            "variants=raw/out/private,raw/in/private"},
                           {"--shm-size", "1G", "-x", "NODAL_CMA=1"});
  expect_all_ranks_ok(r, 2);
  auto algorithms = algorithms_used(r.out);
  // Per rank: f32 1 MiB and 20 MB both ways, i64 2 MiB both ways and 40 MB in place take cma (7
  // cases); i64 40 MB out of place is pipelined (1). Every reduce op of the matrix runs each case.
  EXPECT_GT(algorithms["private:pipelined"], 0) << describe(algorithms);
  EXPECT_EQ(algorithms["private:cma"], 7 * algorithms["private:pipelined"]) << describe(algorithms);
  // Rank 0 in place, rank 1 not: both take cma below 32 MiB, both pipelined at 48 MiB.
  ChildResult mixed = run_coll(2, {"mixed_place"}, {"-x", "NODAL_CMA=1"});
  ASSERT_EQ(mixed.exit_code, 0) << mixed.out << mixed.err;
  EXPECT_EQ(count_lines(mixed.out, R"(mixed_place (1|20) MiB ok \(cma\))"), 4) << mixed.out;
  EXPECT_EQ(count_lines(mixed.out, R"(mixed_place 48 MiB ok \(pipelined\))"), 2) << mixed.out;
  // Rank 0's buffer in the arena, rank 1's private, both in place: no cma (its header holds an
  // arena offset, not an address, which process_vm_readv/writev would take for one), staged instead.
  ChildResult partly = run_coll(2, {"mixed_place", "arena=1"}, {"--shm-size", "1G", "-x", "NODAL_CMA=1"});
  ASSERT_EQ(partly.exit_code, 0) << partly.out << partly.err;
  EXPECT_EQ(count_lines(partly.out, R"(mixed_place (1|20|48) MiB ok \(pipelined\))"), 6) << partly.out;
}

TEST(Collectives, ResultsAreTheSameFromRunToRun) {
  std::vector<std::string> args = {"matrix",
                                   "sizes=7,4097,100003",
                                   "colls=allreduce,reduce_scatter,allgather",
                                   "dtypes=i8,f16,bf16,f32",
                                   "rotate=1",
                                   "variants=raw/out/private,tensor/in/shared"};
  ChildResult first = run_coll(4, args);
  ChildResult second = run_coll(4, args);
  expect_all_ranks_ok(first, 4);
  expect_all_ranks_ok(second, 4);
  auto a = summaries(first.out), b = summaries(second.out);
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(a[rank].digest, b[rank].digest) << "rank " << rank;
}

TEST(Collectives, ReduceKernelsOfEveryInstructionSetGiveTheReferenceBits) {
  // reduce_kernels.cpp is built for the baseline and, on x86-64, for AVX2 (reduce_dispatch.cpp
  // takes AVX2 where the CPU has it). coll_program checks every element against its own scalar
  // reference, so each run passing proves that set's bits; the digests must agree too. Every op
  // and reducing dtype; 7 elements (element by element), 4097 (tiles and a tail), 100003 (many
  // tiles), on 2 and 3 ranks. On a CPU without AVX2 both runs take the baseline; the unit test
  // ReduceKernels.Avx2GivesTheBaselinesBitsForEveryPairAndShape compares the two sets directly.
  std::vector<std::string> args = {"matrix", "sizes=7,4097,100003", "colls=allreduce,reduce,reduce_scatter",
                                   "dtypes=bool,u8,i8,i32,i64,f16,bf16,f32,f64", "ops=all", "rotate=1",
                                   "variants=raw/out/private,tensor/in/shared"};
  for (const int n : {2, 3}) {  // 2: the folds of two sources in one pass, cma's fold into the output
    ChildResult avx2 = run_coll(n, args, {"-x", "NODAL_REDUCE_ISA=avx2"});
    ChildResult baseline = run_coll(n, args, {"-x", "NODAL_REDUCE_ISA=baseline"});
    expect_all_ranks_ok(avx2, n);
    expect_all_ranks_ok(baseline, n);
    auto a = summaries(avx2.out), b = summaries(baseline.out);
    ASSERT_EQ(a.size(), static_cast<std::size_t>(n)) << avx2.out;
    for (int rank = 0; rank < n; ++rank) EXPECT_EQ(a[rank].digest, b[rank].digest) << n << " ranks, rank " << rank;
  }
  // A value it does not know is refused, naming the variable.
  ChildResult bad = run_coll(2, {"matrix", "sizes=4097", "colls=allreduce", "dtypes=f32", "ops=sum"},
                             {"-x", "NODAL_REDUCE_ISA=sse9"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(contains(bad.out + bad.err, "NODAL_REDUCE_ISA='sse9': use auto, avx2 or baseline")) << bad.out << bad.err;
}

TEST(Collectives, ForkserverRanks) {
  ChildResult r = run_coll(3, {"matrix", "sizes=0,7,4097", "variants=raw/out/private,tensor/in/shared"},
                           {"--start-method", "forkserver"});
  expect_all_ranks_ok(r, 3);
}

TEST(Collectives, ASingletonWithoutNodalrunIsAWorldOfOne) {
  ChildResult r = run({kCollProgram, "matrix", "sizes=0,1,7,4097"}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "rank 0 ok ")) << r.out;
}

class Stress : public ::testing::TestWithParam<int> {};

TEST_P(Stress, HundredThousandBackToBackSmallAllreduces) {
  int n = GetParam();
  ChildResult r = run_coll(n, {"stress", "iters=100000"}, {}, 200);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(contains(r.out, "rank " + std::to_string(rank) + " stress ok 100000 allreduces")) << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, Stress, ::testing::Values(2, 3, 8),
                         [](const auto& p) { return "n" + std::to_string(p.param); });

class Errors : public ::testing::TestWithParam<int> {};

TEST_P(Errors, MismatchedArgumentsThrowUsageErrorOnEveryRankAndTheCommunicatorStillWorks) {
  int n = GetParam();
  ChildResult r = run_coll(n, {"mismatch"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::regex ok(R"(\[(\d+)\] rank \d+ mismatch ok (\d+) cases)");
  std::map<int, int> cases;
  for (const std::string& l : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(l, m, ok)) cases[std::stoi(m[1])] = std::stoi(m[2]);
  }
  ASSERT_EQ(cases.size(), static_cast<std::size_t>(n)) << r.out;
  for (const auto& [rank, count] : cases) EXPECT_EQ(count, cases[0]) << rank;
  EXPECT_GE(cases[0], 40);
  // Messages say what was wrong: the first case is a count mismatch.
  EXPECT_TRUE(contains(r.out, "case allreduce count 8 vs 9: UsageError: ")) << r.out;
  EXPECT_EQ(count_lines(r.out, R"(case allgather count too large: UsageError: allgather: count \d+ is too large)"), n) << r.out;
  EXPECT_EQ(count_lines(r.out, R"(case broadcast dtype not a DType: UsageError: broadcast: dtype value 42 is not)"), n)
      << r.out;
  EXPECT_EQ(count_lines(r.out, R"(case alltoallv dtype not a DType: UsageError: alltoallv: dtype value 42 is not)"), n)
      << r.out;
  // Both roots of "broadcast root 0 vs 1" are senders of a small rooted call, which check nothing:
  // rank 0 learns of it at its next call, from the history of calls in the headers.
  EXPECT_TRUE(contains(r.out, "rank 0 case broadcast root 0 vs 1: UsageError at the next call: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "but their calls since call")) << r.out;
}

TEST_P(Errors, SendRecvInOrderEveryPairAndMismatchedCountsDtypesAndTags) {
  int n = GetParam();
  ChildResult r = run_coll(n, {"p2p"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(contains(r.out, "rank " + std::to_string(rank) + " p2p ok")) << r.out;
  }
  // A mismatch per direction: 0->1 and 1->0, then 0->2 and 2->0. Both sides throw, and so does every
  // later call on that direction (the library declares the channel unusable).
  std::vector<std::pair<std::string, int>> cases = {{"send 8 recv 7", 1}, {"send tag 5 recv tag 6", 1}};
  if (n >= 3) cases.insert(cases.end(), {{"send f32 recv i32", 2}, {"send large recv large+1", 2}});
  for (const auto& [name, peer] : cases) {
    for (int rank : {0, peer}) {
      std::string prefix = "rank " + std::to_string(rank) + " p2p case " + name;
      EXPECT_TRUE(contains(r.out, prefix + ": UsageError: ")) << prefix << "\n" << r.out;
      EXPECT_TRUE(contains(r.out, prefix + ", later call: UsageError: ")) << prefix << "\n" << r.out;
    }
  }
  // The tags case ran 1 -> 0: the receiver's error names both tags, the sender's the one it sent.
  EXPECT_EQ(count_lines(r.out, R"(rank 0 p2p case send tag 5 recv tag 6: UsageError: recv of 8 x \S+ \(tag 6\).*\(tag 5\))"), 1)
      << r.out;
  EXPECT_TRUE(contains(r.out, "tag 5); the pair's channel is unusable now")) << r.out;
}

TEST_P(Errors, SmallRootedCallsLetSendersRunAheadWithEveryResultRight) {
  int n = GetParam();
  ChildResult r = run_coll(n, {"rooted", "iters=20000"}, {}, 200);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_lines(r.out, R"(rank \d+ rooted ok 20000 calls)"), n) << r.out;
}

TEST(Collectives, TheAlgorithmTableHasTwoRowsPerOpAndNamesEachPath) {
  const std::vector<AlgorithmRule> table = Communicator::algorithm_table();
  ASSERT_EQ(table.size(), 16u);  // 8 ops: the small path up to 16 KiB, then the rest
  std::map<std::string, std::string> small, large;
  for (std::size_t i = 0; i < table.size(); i += 2) {
    EXPECT_EQ(table[i].op, table[i + 1].op);
    EXPECT_EQ(table[i].max_bytes, 16u * 1024) << table[i].op;
    EXPECT_EQ(table[i + 1].max_bytes, SIZE_MAX) << table[i].op;
    large[table[i].op] = table[i + 1].algorithm;
    const bool rooted = table[i].op == "broadcast" || table[i].op == "scatter" || table[i].op == "gather" ||
                        table[i].op == "reduce";
    EXPECT_TRUE(table[i].algorithm.starts_with(rooted ? "small (the sender posts and returns)" : "small"))
        << table[i].op;
    small[table[i].op] = table[i].algorithm;
  }
  // The ops that go further where ranks outnumber cores (shm/algorithm_table.hpp small_max_bytes) say so.
  EXPECT_EQ(small["broadcast"], "small (the sender posts and returns); up to 64 KiB on 2-4 ranks outnumbering cores");
  EXPECT_EQ(small["scatter"], "small (the sender posts and returns); up to 64 KiB on 2-4 ranks outnumbering cores");
  EXPECT_EQ(small["reduce"], "small (the sender posts and returns); up to 32 KiB on 4 ranks outnumbering cores");
  EXPECT_EQ(small["allreduce"], "small");
  EXPECT_EQ(small["gather"], "small (the sender posts and returns)");
  EXPECT_EQ(large["reduce_scatter"], "in_place if every rank's buffers are in the arena, else pipelined");
  EXPECT_TRUE(contains(large["reduce"], "while (world_size - 1) * size <= 256 KiB: linear when ranks outnumber cores, "
                                       "else cma from 16 KiB where allowed; else on 2 ranks with a core each linear "
                                       "up to 8 MiB; else pipelined"))
      << large["reduce"];
  EXPECT_TRUE(contains(large["allreduce"], "on 2 ranks cma from 1 MiB below 32 MiB (in place up to 64 MiB)"))
      << large["allreduce"];
  const bool intel = intel_processor();
  EXPECT_TRUE(contains(large["alltoall"], std::string("else cma from 16 KiB (below ") + (intel ? "16 MiB" : "512 KiB") +
                                              " unless ranks outnumber cores) where allowed, else pipelined"))
      << large["alltoall"];
  EXPECT_TRUE(contains(large["broadcast"], intel ? "else cma from 16 KiB where allowed, else pipelined"
                                                 : "else cma from 16 KiB (below 2 MiB unless ranks outnumber cores)"))
      << large["broadcast"];
  EXPECT_TRUE(contains(large["scatter"], intel ? "else cma from 16 KiB where allowed, else pipelined"
                                               : "else cma from 16 KiB (below 1 MiB unless ranks outnumber cores)"))
      << large["scatter"];
}

INSTANTIATE_TEST_SUITE_P(Collectives, Errors, ::testing::Values(2, 3, 8),
                         [](const auto& p) { return "n" + std::to_string(p.param); });

TEST(Collectives, RanksCallingDifferentCollectivesGetUsageError) {
  ChildResult r = run_coll(3, {"mismatch_kind"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(r.out, "rank " + std::to_string(rank) + " mismatch_kind ok 2 cases")) << r.out;
  }
}

}  // namespace
}  // namespace nodal::testing
