// Rank program of tests/integration/vector_collectives_test.cpp: the v-variants against values
// computed here.
//   vector_program results    allgatherv, gatherv, scatterv, alltoallv, reduce_scatterv (f32, i64,
//                             bf16 sum, i32 max), uneven counts with zeros, small and large, three
//                             rounds (staging reused and grown), fixed-size calls between them;
//                             prints "rank R: N checks ok"
//   vector_program mismatch   rank 1's counts (allgatherv) and then rank 0's recv_counts
//                             (alltoallv) disagree: the same UsageError on every rank, each time,
//                             and the communicator goes on
//   vector_program bad_args   counts of the wrong length: UsageError on this rank before any peer
//                             is involved
#include <nodal/communicator.hpp>
#include <nodal/errors.hpp>
#include <nodal/nodal.hpp>

#include "../support/rank_checks.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

using nodal::DType;
using nodal::ReduceOp;
using nodal::Tensor;

using nodal::testing::expect;
using nodal::testing::fail;
using nodal::testing::g_checks;

/// Element i of rank r's data: exact in f32 and bf16 sums of a few ranks (small integers).
double value(int r, std::size_t i) { return static_cast<double>(r * 8 + static_cast<int>(i % 13)); }

template <class T>
Tensor make(std::size_t n, int r, std::size_t first = 0) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(n)}, DType::f32);
  if constexpr (std::is_same_v<T, std::int64_t>) t = Tensor::empty({static_cast<std::int64_t>(n)}, DType::i64);
  for (std::size_t i = 0; i < n; ++i) t.data_ptr<T>()[i] = static_cast<T>(value(r, first + i));
  return t;
}

template <class T>
double at(const Tensor& t, std::size_t i) {
  return static_cast<double>(t.data_ptr<T>()[i]);
}

std::vector<std::int64_t> counts_for(int n, std::size_t scale, int round) {
  std::vector<std::int64_t> counts;
  for (int j = 0; j < n; ++j) counts.push_back(static_cast<std::int64_t>(((j * 7 + 3 + round) % 5) * scale));
  return counts;  // includes zeros
}

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

template <class T>
void round_of(nodal::Communicator& comm, std::size_t scale, int round) {
  const int n = comm.world_size(), r = comm.rank();
  const std::vector<std::int64_t> counts = counts_for(n, scale, round);
  const auto mine = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
  const DType dtype = std::is_same_v<T, float> ? DType::f32 : DType::i64;
  auto empty = [&](std::int64_t k) { return Tensor::empty({k}, dtype); };

  // allgatherv: block j is rank j's data.
  Tensor in = make<T>(mine, r);
  Tensor out = empty(sum(counts));
  comm.allgatherv(in, out, counts);
  std::size_t offset = 0;
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(counts[j]); i += 1 + i / 4)
      expect(at<T>(out, offset + i) == value(j, i), "allgatherv block " + std::to_string(j));
    offset += static_cast<std::size_t>(counts[j]);
  }
  // gatherv onto the last rank.
  Tensor gathered = r == n - 1 ? empty(sum(counts)) : Tensor();
  comm.gatherv(in, gathered, r == n - 1 ? counts : std::vector<std::int64_t>{}, n - 1);
  if (r == n - 1) {
    offset = 0;
    for (int j = 0; j < n; ++j) {
      if (counts[j] > 0) expect(at<T>(gathered, offset + counts[j] - 1) == value(j, counts[j] - 1), "gatherv");
      offset += static_cast<std::size_t>(counts[j]);
    }
  }
  // scatterv from rank 0: rank r gets elements [prefix, prefix + counts[r]) of rank 0's data.
  Tensor whole = r == 0 ? make<T>(static_cast<std::size_t>(sum(counts)), 0) : Tensor();
  Tensor part = empty(counts[r]);
  comm.scatterv(whole, part, r == 0 ? counts : std::vector<std::int64_t>{}, 0);
  const auto first = static_cast<std::size_t>(std::accumulate(counts.begin(), counts.begin() + r, std::int64_t{0}));
  for (std::size_t i = 0; i < mine; i += 1 + i / 4) expect(at<T>(part, i) == value(0, first + i), "scatterv");
  // alltoallv: rank p sends f(p, q) elements to q: elements [k, k + f) of p's data with k the
  // prefix of f(p, .) below q.
  auto f = [&](int p, int q) { return static_cast<std::int64_t>(((p + 2 * q + round) % 4) * scale); };
  std::vector<std::int64_t> send, receive;
  for (int q = 0; q < n; ++q) send.push_back(f(r, q));
  for (int p = 0; p < n; ++p) receive.push_back(f(p, r));
  Tensor a_in = make<T>(static_cast<std::size_t>(sum(send)), r);
  Tensor a_out = empty(sum(receive));
  comm.alltoallv(a_in, a_out, send, receive);
  offset = 0;
  for (int p = 0; p < n; ++p) {
    std::size_t k = 0;
    for (int q = 0; q < r; ++q) k += static_cast<std::size_t>(f(p, q));
    for (std::size_t i = 0; i < static_cast<std::size_t>(receive[p]); i += 1 + i / 4)
      expect(at<T>(a_out, offset + i) == value(p, k + i), "alltoallv from " + std::to_string(p));
    offset += static_cast<std::size_t>(receive[p]);
  }
  // reduce_scatterv, sum: element first + i of every rank's data, summed.
  Tensor rs_in = make<T>(static_cast<std::size_t>(sum(counts)), r);
  Tensor rs_out = empty(counts[r]);
  comm.reduce_scatterv(rs_in, rs_out, counts, ReduceOp::sum);
  for (std::size_t i = 0; i < mine; i += 1 + i / 4) {
    double expected = 0;
    for (int j = 0; j < n; ++j) expected += value(j, first + i);
    expect(at<T>(rs_out, i) == expected, "reduce_scatterv sum at " + std::to_string(i));
  }
  // A fixed-size call between: the sequence goes on.
  Tensor one = make<T>(1, r);
  comm.allreduce(one, ReduceOp::max);
  expect(at<T>(one, 0) == value(n - 1, 0), "allreduce between the v-variants");
}

/// bf16 sums (accumulated in f32, rounded once) and i32 max through reduce_scatterv, against the
/// fixed-size reduce_scatter on the same data when the counts are even.
void against_reduce_scatter(nodal::Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  for (DType dtype : {DType::bf16, DType::i32}) {
    const ReduceOp op = dtype == DType::bf16 ? ReduceOp::sum : ReduceOp::max;
    const std::int64_t each = 1003;
    Tensor in = Tensor::empty({each * n}, dtype);
    auto* raw = static_cast<std::uint8_t*>(in.data());
    for (std::size_t b = 0; b < in.nbytes(); ++b) raw[b] = static_cast<std::uint8_t>((b * 31 + static_cast<std::size_t>(r) * 7) % 127);
    Tensor fixed = Tensor::empty({each}, dtype), vector = Tensor::empty({each}, dtype);
    comm.reduce_scatter(in, fixed, op);
    comm.reduce_scatterv(in, vector, std::vector<std::int64_t>(static_cast<std::size_t>(n), each), op);
    expect(std::memcmp(fixed.data(), vector.data(), fixed.nbytes()) == 0, "reduce_scatterv == reduce_scatter bitwise");
  }
}

int results(nodal::Communicator& comm) {
  for (int round = 0; round < 3; ++round) {
    round_of<float>(comm, 1, round);
    round_of<std::int64_t>(comm, 3, round);
    round_of<float>(comm, round == 1 ? 70001 : 257, round);  // grows the staging, then reuses it
  }
  against_reduce_scatter(comm);
  std::printf("rank %d: %ld checks ok\n", comm.rank(), g_checks);
  return 0;
}

int mismatch(nodal::Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 4);
  if (r == 1) counts[0] = 5;
  Tensor in = make<float>(4, r), out = Tensor::empty({4 * n + (r == 1 ? 1 : 0)}, DType::f32);
  try {
    comm.allgatherv(in, out, counts);
    fail("no UsageError for disagreeing counts");
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: UsageError: %s\n", r, e.what());
  }
  std::vector<std::int64_t> send(static_cast<std::size_t>(n), 2), receive(static_cast<std::size_t>(n), 2);
  if (r == 0) receive[static_cast<std::size_t>(n - 1)] = 3;
  Tensor a_in = make<float>(static_cast<std::size_t>(2 * n), r);
  Tensor a_out = Tensor::empty({sum(receive)}, DType::f32);
  try {
    comm.alltoallv(a_in, a_out, send, receive);
    fail("no UsageError for disagreeing alltoallv counts");
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: UsageError: %s\n", r, e.what());
  }
  std::vector<std::int64_t> good(static_cast<std::size_t>(n), 4);
  Tensor ok_out = Tensor::empty({4 * n}, DType::f32);
  comm.allgatherv(in, ok_out, good);
  expect(at<float>(ok_out, 4 * (n - 1)) == value(n - 1, 0), "allgatherv after the mismatches");
  std::printf("rank %d: usable after the mismatches\n", r);
  return 0;
}

int bad_args(nodal::Communicator& comm) {
  Tensor in = make<float>(4, comm.rank()), out = Tensor::empty({4}, DType::f32);
  try {
    comm.allgatherv(in, out, {4});  // one entry for a communicator of more ranks
    fail("no UsageError");
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: UsageError at once: %s\n", comm.rank(), e.what());
  }
  try {
    comm.alltoallv(in, out, {4, -1}, {4, 0});
    fail("no UsageError for a negative count");
  } catch (const nodal::UsageError& e) {
    std::printf("rank %d: UsageError at once: %s\n", comm.rank(), e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return nodal::testing::run_mode(argc, argv, "vector_program", {{"results", results},
{"mismatch", mismatch},
{"bad_args", bad_args}});
}
