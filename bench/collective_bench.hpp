// The measurement that nodal-bench (bench/nodal_bench.cpp) and its peers (bench/peers/mpi_bench.cpp,
// bench/peers/gloo_bench.cpp) share: options, message sizes, warm-up and iteration policy, timing
// loops, result check and CSV. Every library runs this very loop, so that a difference in the table
// is the library's, not the harness's. Header-only and free of nodal (standard library and CLI11),
// because the peers are built by bench/compare.sh with mpicxx or g++ alone.
//
// A library plugs in as a Backend (the concept below): buffers, one collective call, a barrier and
// a max over ranks. run_benchmark() does the rest and rank 0 writes CSV rows
//
//   lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps
//
//   bytes  per-rank message size, as OSU names it: the buffer of allreduce, reduce and broadcast;
//          each rank's contribution to allgather and gather; each rank's block of reduce_scatter
//          and scatter (the output); the block each pair of ranks exchanges in alltoall. 0 for
//          barrier. The message of pingpong: rank 0 sends it to the last rank (across nodes, on
//          another node), which sends it back (usec is the round trip; osu_latency prints half).
//          Sizes run over powers of two from --min-bytes to --max-bytes.
//   usec   microseconds per call: the max over ranks of each rank's time per call (OSU's "max"
//          column; a collective is done when its slowest rank is). A rank's time per call is, with
//          --timing back_to_back, the mean over `iters` calls issued back to back between two clock
//          reads (OSU and nccl-tests do this); with --timing barrier, the median over `iters` calls
//          each timed alone right after a barrier (no overlap of one call's tail with the next
//          call's head; the barrier's exit skew between ranks is part of the figure).
//   algbw  nccl-tests' algorithm bandwidth S / time in GB/s (1e9 bytes), with S nccl-tests' size:
//          bytes for allreduce, reduce and broadcast; world_size * bytes for allgather, gather,
//          reduce_scatter, scatter and alltoall (the whole gathered or scattered buffer). With
//          these sizes the figures are those nccl-tests prints for the same buffers.
//   busbw  algbw times nccl-tests' bus factor (src/*.cu GetBw): allreduce 2(n-1)/n; allgather,
//          reduce_scatter, alltoall, gather, scatter (n-1)/n; broadcast, reduce 1; pingpong 2
//          (the message crosses twice).
//
// Iterations (unless --iters / --warmup say otherwise): warm-up runs batches of 1, 2, 4, ... calls,
// shaped like the timed loop, until a batch (the second or later) lasts >= a quarter of --target-ms
// on the slowest rank; the time per call of the better of the last two batches (max over ranks, so
// that every rank picks the same count) sets iters to --target-ms worth, clamped to [--min-iters,
// --max-iters]. Small messages thus get up to 100k calls and 64 MiB a handful, and a slow library
// (Gloo) is not run for minutes.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace collective_bench {

enum class Op { allreduce, broadcast, allgather, reduce_scatter, alltoall, reduce, gather, scatter, barrier, pingpong };
enum class Timing { back_to_back, barrier };
/// The element types every library here has (MPI_FLOAT, MPI_DOUBLE, MPI_INT; gloo's float, ...).
enum class DType { f32, f64, i32 };

inline constexpr std::array<std::pair<std::string_view, Op>, 10> kOps = {{{"allreduce", Op::allreduce},
                                                                         {"broadcast", Op::broadcast},
                                                                         {"allgather", Op::allgather},
                                                                         {"reduce_scatter", Op::reduce_scatter},
                                                                         {"alltoall", Op::alltoall},
                                                                         {"reduce", Op::reduce},
                                                                         {"gather", Op::gather},
                                                                         {"scatter", Op::scatter},
                                                                         {"barrier", Op::barrier},
                                                                         {"pingpong", Op::pingpong}}};

/// pingpong's two ends: rank 0 and the last rank.
inline int pingpong_peer(int world_size) { return world_size - 1; }

inline std::string_view op_name(Op op) {
  for (const auto& [name, value] : kOps) {
    if (value == op) return name;
  }
  return "?";
}

inline std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
  }
  return "?";
}

inline std::size_t element_size(DType dtype) { return dtype == DType::f64 ? 8 : 4; }

/// Every rank's root for the rooted collectives (OSU and nccl-tests default to 0 as well).
inline constexpr int kRoot = 0;

/// Ops whose in-place form the benchmark knows (the ones nodal, MPI and nccl-tests define).
inline bool has_in_place(Op op) { return op == Op::allreduce || op == Op::allgather || op == Op::reduce_scatter; }

/// Whether an op's buffers are world_size blocks of the per-rank message (see the header comment).
inline bool is_blocked(Op op) {
  return op == Op::allgather || op == Op::gather || op == Op::reduce_scatter || op == Op::scatter || op == Op::alltoall;
}

/// nccl-tests' bus bandwidth factor for `world_size` ranks.
inline double busbw_factor(Op op, int world_size) {
  const double n = world_size;
  switch (op) {
    case Op::allreduce:
      return 2 * (n - 1) / n;
    case Op::allgather:
    case Op::reduce_scatter:
    case Op::alltoall:
    case Op::gather:
    case Op::scatter:
      return (n - 1) / n;
    case Op::pingpong:
      return 2;
    case Op::broadcast:
    case Op::reduce:
    case Op::barrier:
      return 1;
  }
  return 1;
}

/// Elements of the input and output buffer of one call with `count` elements per rank message.
struct Layout {
  std::size_t input = 0;
  std::size_t output = 0;
};

inline Layout layout(Op op, std::size_t count, int world_size) {
  const std::size_t blocks = count * static_cast<std::size_t>(world_size);
  switch (op) {
    case Op::allreduce:
    case Op::reduce:
    case Op::pingpong:
      return {count, count};
    case Op::broadcast:
      return {0, count};  // one buffer, the output, on every rank
    case Op::allgather:
    case Op::gather:
      return {count, blocks};
    case Op::reduce_scatter:
    case Op::scatter:
      return {blocks, count};
    case Op::alltoall:
      return {blocks, blocks};
    case Op::barrier:
      return {0, 0};
  }
  return {};
}

/// "64M", "1KiB", "4096": bytes, with binary multipliers K, M, G (an optional "i" and "B" after).
inline std::size_t parse_bytes(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) throw CLI::ValidationError("size", "not a size: '" + text + "' (say 4, 64K, 64M or 1G)");
  std::size_t value = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  if (unit.ends_with("B")) unit.pop_back();
  if (unit.ends_with("i")) unit.pop_back();
  if (unit == "K" || unit == "k") {
    value <<= 10;
  } else if (unit == "M") {
    value <<= 20;
  } else if (unit == "G") {
    value <<= 30;
  } else if (!unit.empty()) {
    throw CLI::ValidationError("size", "unknown unit in '" + text + "' (K, M or G)");
  }
  return value;
}

struct Options {
  std::vector<Op> ops = {Op::allreduce};
  std::size_t min_bytes = 4;
  std::size_t max_bytes = std::size_t{64} << 20;
  DType dtype = DType::f32;
  Timing timing = Timing::back_to_back;
  bool in_place = false;
  long iters = 0;    ///< 0: from target_ms
  long warmup = -1;  ///< -1: batches until a quarter of target_ms
  double target_ms = 40;
  long min_iters = 3;  ///< a slow library (MPICH oversubscribed: ~0.5 s per call) still ends
  long max_iters = 100000;
  bool check = false;
  bool header = true;
  bool verbose = false;
  std::string lib;       ///< the CSV's lib column; empty: the backend's name
  std::string csv_path;  ///< rank 0 appends rows here; stdout when empty
};

/// What CLI11 stores as text (sizes with suffixes, names) until finish_options() turns it into Options.
struct OptionText {
  std::vector<std::string> ops = {"allreduce"};
  std::string min_bytes = "4";
  std::string max_bytes = "64M";
  std::string dtype = "f32";
  std::string timing = "back_to_back";
  bool no_header = false;
};

/// Adds the options every benchmark program shares to `app`; call finish_options() after parsing.
inline void add_options(CLI::App& app, Options& options, OptionText& text) {
  std::string op_list;
  for (const auto& [name, op] : kOps) op_list += std::string(op_list.empty() ? "" : "|") + std::string(name);
  app.add_option("--op", text.ops, op_list + " (comma list)")->delimiter(',')->capture_default_str();
  app.add_option("--min-bytes", text.min_bytes, "smallest per-rank message (K, M, G suffixes)")->capture_default_str();
  app.add_option("--max-bytes", text.max_bytes, "largest per-rank message; sizes double from --min-bytes")
      ->capture_default_str();
  app.add_option("--dtype", text.dtype, "element type")
      ->check(CLI::IsMember({"f32", "f64", "i32"}))
      ->capture_default_str();
  app.add_option("--timing", text.timing,
                 "back_to_back: mean over calls issued back to back; barrier: median over calls each "
                 "timed alone after a barrier")
      ->check(CLI::IsMember({"back_to_back", "barrier"}))
      ->capture_default_str();
  app.add_flag("--in-place", options.in_place,
               "allreduce, allgather, reduce_scatter in place (the lib column gets '-inplace')");
  app.add_option("--iters", options.iters, "timed calls per size (default: --target-ms worth)");
  app.add_option("--warmup", options.warmup,
                 "untimed calls per size first (default: batches until one lasts a quarter of --target-ms)");
  app.add_option("--target-ms", options.target_ms, "timed milliseconds per size that sets the automatic --iters")
      ->capture_default_str();
  app.add_option("--min-iters", options.min_iters, "automatic --iters at least")->capture_default_str();
  app.add_option("--max-iters", options.max_iters, "automatic --iters at most")->capture_default_str();
  app.add_flag("--check", options.check, "verify the result of one extra call per size against a reference");
  app.add_flag("--no-header", text.no_header, "no CSV header line");
  app.add_flag("-v,--verbose", options.verbose, "rank 0 says on stderr how each size ran (iterations, algorithm)");
  app.add_option("--lib", options.lib, "the CSV's lib column (default: the library's name)");
  app.add_option("--csv", options.csv_path, "rank 0 appends the rows to FILE instead of printing them");
}

/// The exit code for a command line CLI11 rejected, after printing why: 0 for --help, 2 (the
/// convention nodalrun and most tools follow) for a usage error.
inline int exit_for(const CLI::App& app, const CLI::ParseError& error) {
  const int code = app.exit(error);
  return code == 0 ? 0 : 2;
}

inline void finish_options(Options& options, const OptionText& text) {
  options.header = !text.no_header;
  options.ops.clear();
  for (const std::string& name : text.ops) {
    const auto it = std::find_if(kOps.begin(), kOps.end(), [&](const auto& entry) { return entry.first == name; });
    if (it == kOps.end()) throw CLI::ValidationError("--op", "unknown op '" + name + "'");
    options.ops.push_back(it->second);
  }
  options.min_bytes = parse_bytes(text.min_bytes);
  options.max_bytes = parse_bytes(text.max_bytes);
  if (options.min_bytes == 0 || options.min_bytes > options.max_bytes) {
    throw CLI::ValidationError("--min-bytes", "need 0 < --min-bytes <= --max-bytes");
  }
  if (text.dtype == "f32") {
    options.dtype = DType::f32;
  } else if (text.dtype == "f64") {
    options.dtype = DType::f64;
  } else if (text.dtype == "i32") {
    options.dtype = DType::i32;
  } else {
    throw CLI::ValidationError("--dtype", "f32, f64 or i32, not '" + text.dtype + "'");
  }
  if (text.timing == "back_to_back") {
    options.timing = Timing::back_to_back;
  } else if (text.timing == "barrier") {
    options.timing = Timing::barrier;
  } else {
    throw CLI::ValidationError("--timing", "back_to_back or barrier, not '" + text.timing + "'");
  }
  if (options.warmup == 0 && options.iters == 0) {
    throw CLI::ValidationError("--warmup", "--warmup 0 leaves nothing to size --iters from: give --iters too");
  }
  if (options.iters < 0 || options.min_iters < 1 || options.max_iters < options.min_iters || options.target_ms <= 0) {
    throw CLI::ValidationError("--iters", "need --iters >= 0, 1 <= --min-iters <= --max-iters, --target-ms > 0");
  }
}

/// One collective call as the driver sets it up; pointers follow nodal's in-place conventions
/// (allreduce: input == output; allgather: input == output + rank * count; reduce_scatter:
/// output == input + rank * count). A backend whose library spells in-place otherwise (MPI_IN_PLACE)
/// translates, and says through result() where its result lands.
struct Call {
  Op op = Op::allreduce;
  DType dtype = DType::f32;
  std::size_t count = 0;  ///< elements per rank message (bytes / element size)
  bool in_place = false;
  void* input = nullptr;
  void* output = nullptr;
};

struct Buffers {
  void* input = nullptr;
  void* output = nullptr;
};

/// What a library provides. allocate() is called once with the largest sizes any selected op needs;
/// prepare() once per (op, size) before the warm-up (untimed: Gloo builds its options objects
/// there); run() is the call being measured.
template <class B>
concept Backend = requires(B b, const Call& call, double x, std::size_t bytes) {
  { b.rank() } -> std::convertible_to<int>;
  { b.world_size() } -> std::convertible_to<int>;
  { b.name() } -> std::convertible_to<std::string>;
  { b.allocate(bytes, bytes) } -> std::same_as<Buffers>;
  b.prepare(call);
  b.run(call);
  b.barrier();
  { b.max_over_ranks(x) } -> std::convertible_to<double>;
  { b.result(call) } -> std::convertible_to<const void*>;
  { b.algorithm() } -> std::convertible_to<std::string>;
};

/// Page-aligned private memory for the peers' buffers (nodal-bench allocates nodal Tensors).
class PageBuffer {
 public:
  explicit PageBuffer(std::size_t bytes) {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
    data_.reset(std::aligned_alloc(4096, rounded));
    if (!data_) throw std::bad_alloc();
  }
  void* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
};

namespace detail {

/// Rank r's input element at index i (of its whole input buffer): small integers, so that every
/// sum over up to ~1000 ranks is exact in f32 and the check can demand bitwise equality. They
/// name the rank and the position, so that a block landing in the wrong place is caught.
inline double input_value(int rank, std::size_t index) {
  return static_cast<double>((rank % 251) * 64 + static_cast<int>(index % 61));
}

/// Writes rank `rank`'s input values for indices 0 .. count-1 of its buffer.
template <class T>
void fill_values(void* buffer, std::size_t count, int rank) {
  T* p = static_cast<T*>(buffer);
  for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>(input_value(rank, i));
}

template <class T>
void fill_constant(void* buffer, std::size_t count, double value) {
  std::fill_n(static_cast<T*>(buffer), count, static_cast<T>(value));
}

template <class F>
decltype(auto) with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(std::int32_t{});
    case DType::f32:
      break;
  }
  return f(float{});
}

/// Writes this rank's inputs for `call` and poisons its outputs first (-1 never is a correct
/// result), so that in place, where the input is part of the output, the input survives.
inline void fill(const Call& call, int rank, int world_size) {
  with_type(call.dtype, [&](auto zero) {
    using T = decltype(zero);
    const Layout l = layout(call.op, call.count, world_size);
    if (call.op == Op::broadcast) {  // one buffer: root's holds the message
      if (rank == kRoot) {
        fill_values<T>(call.output, call.count, rank);
      } else {
        fill_constant<T>(call.output, call.count, -1);
      }
      return;
    }
    if (l.output > 0) fill_constant<T>(call.output, l.output, -1);
    if (l.input > 0) fill_values<T>(call.input, l.input, rank);
  });
}

/// The reference for element i of the result of `call` on `rank`; NaN where nothing is expected.
inline double expected_value(const Call& call, std::size_t i, int rank, int world_size) {
  const std::size_t count = call.count;
  auto sum_over_ranks = [&](std::size_t index) {
    double sum = 0;
    for (int r = 0; r < world_size; ++r) sum += input_value(r, index);
    return sum;
  };
  switch (call.op) {
    case Op::allreduce:
    case Op::reduce:
      return sum_over_ranks(i);
    case Op::broadcast:
      return input_value(kRoot, i);
    case Op::pingpong:
      return input_value(0, i);  // rank 0's message, on rank 0 back from the last rank
    case Op::allgather:
    case Op::gather:
      return input_value(static_cast<int>(i / count), i % count);
    case Op::reduce_scatter:
      return sum_over_ranks(static_cast<std::size_t>(rank) * count + i);
    case Op::scatter:
      return input_value(kRoot, static_cast<std::size_t>(rank) * count + i);
    case Op::alltoall:
      // Block j of this rank's output is block `rank` of rank j's input.
      return input_value(static_cast<int>(i / count), static_cast<std::size_t>(rank) * count + i % count);
    case Op::barrier:
      break;
  }
  return std::nan("");
}

/// Throws std::runtime_error naming the first wrong element of this rank's result.
inline void verify(const Call& call, const void* result, int rank, int world_size) {
  if (call.op == Op::barrier) return;
  if ((call.op == Op::reduce || call.op == Op::gather) && rank != kRoot) return;
  if (call.op == Op::pingpong && rank != 0 && rank != pingpong_peer(world_size)) return;
  const Layout l = layout(call.op, call.count, world_size);
  with_type(call.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* p = static_cast<const T*>(result);
    for (std::size_t i = 0; i < l.output; ++i) {
      const T want = static_cast<T>(expected_value(call, i, rank, world_size));
      if (p[i] != want) {
        throw std::runtime_error("check failed: " + std::string(op_name(call.op)) + " of " +
                                 std::to_string(call.count * element_size(call.dtype)) + " bytes, rank " +
                                 std::to_string(rank) + ", element " + std::to_string(i) + ": got " +
                                 std::to_string(static_cast<double>(p[i])) + ", want " +
                                 std::to_string(static_cast<double>(want)));
      }
    }
  });
}

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// One loop of `calls` calls shaped as options.timing says. stat: this rank's seconds per call
/// (mean, or median of single calls); wall: the loop's seconds, barriers included.
struct LoopTime {
  double stat = 0;
  double wall = 0;
};

template <Backend B>
LoopTime time_loop(B& backend, const Call& call, long calls, Timing timing, std::vector<double>& samples) {
  if (calls <= 0) return {};
  if (timing == Timing::back_to_back) {
    backend.barrier();
    const auto start = Clock::now();
    for (long i = 0; i < calls; ++i) backend.run(call);
    const double wall = seconds(Clock::now() - start);
    return {wall / static_cast<double>(calls), wall};
  }
  samples.clear();
  const auto start = Clock::now();
  for (long i = 0; i < calls; ++i) {
    backend.barrier();
    const auto t0 = Clock::now();
    backend.run(call);
    samples.push_back(seconds(Clock::now() - t0));
  }
  const double wall = seconds(Clock::now() - start);
  auto middle = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
  std::nth_element(samples.begin(), middle, samples.end());
  return {*middle, wall};
}

inline std::string format_row(const std::string& lib, Op op, int world_size, std::size_t bytes, double usec) {
  const double nccl_size = static_cast<double>(bytes) * (is_blocked(op) ? world_size : 1);
  const double algbw = usec > 0 ? nccl_size / (usec * 1e3) : 0;  // bytes per us / 1e3 = GB/s
  const double busbw = algbw * busbw_factor(op, world_size);
  char line[256];
  std::snprintf(line, sizeof line, "%s,%s,%d,%zu,%.3f,%.6g,%.6g\n", lib.c_str(), std::string(op_name(op)).c_str(),
                world_size, bytes, usec, algbw, busbw);
  return line;
}

}  // namespace detail

inline constexpr const char* kCsvHeader = "lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps\n";

/// Runs every selected op over every size; rank 0 writes the CSV. Throws what the backend throws,
/// and std::runtime_error when --check finds a wrong result.
template <Backend B>
void run_benchmark(B& backend, const Options& options) {
  const int rank = backend.rank();
  const int world_size = backend.world_size();
  const std::size_t esize = element_size(options.dtype);

  std::vector<std::size_t> sizes;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    if (bytes % esize == 0) sizes.push_back(bytes);  // 4 B of f64 is no message
  }

  // One pair of buffers for the whole run, as large as the largest call needs: allocating per size
  // would time page faults, and the arena (nodal-arena) would fragment.
  std::size_t input_elements = 0, output_elements = 0;
  for (Op op : options.ops) {
    const Layout l = layout(op, options.max_bytes / esize, world_size);
    input_elements = std::max(input_elements, l.input);
    output_elements = std::max(output_elements, l.output);
  }
  const Buffers buffers = backend.allocate(input_elements * esize, output_elements * esize);

  std::FILE* out = stdout;
  if (rank == 0 && !options.csv_path.empty()) {
    out = std::fopen(options.csv_path.c_str(), "a");
    if (!out) throw std::runtime_error("cannot open --csv " + options.csv_path + ": " + std::strerror(errno));
  }
  const std::string base_lib = options.lib.empty() ? backend.name() : options.lib;
  // The header goes first into a new or empty file, and always onto a pipe or terminal.
  if (rank == 0 && options.header && (std::fseek(out, 0, SEEK_END) != 0 || std::ftell(out) <= 0)) {
    std::fputs(kCsvHeader, out);
  }

  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(std::max(options.max_iters, options.iters)));
  for (Op op : options.ops) {
    const std::vector<std::size_t> op_sizes = op == Op::barrier ? std::vector<std::size_t>{0} : sizes;
    for (std::size_t bytes : op_sizes) {
      Call call{op, options.dtype, bytes / esize, options.in_place && has_in_place(op), buffers.input, buffers.output};
      if (op == Op::broadcast) call.input = call.output;
      if (call.in_place && op == Op::allreduce) call.input = call.output;
      if (call.in_place && op == Op::allgather) {
        call.input = static_cast<char*>(call.output) + static_cast<std::size_t>(rank) * bytes;
      }
      if (call.in_place && op == Op::reduce_scatter) {
        call.output = static_cast<char*>(call.input) + static_cast<std::size_t>(rank) * bytes;
      }
      detail::fill(call, rank, world_size);  // also the first touch of every page this size uses
      backend.prepare(call);

      // Warm-up, which also measures what one call costs.
      double per_call = 0;
      long warm_calls = 0;
      if (options.warmup >= 0) {
        const detail::LoopTime t = detail::time_loop(backend, call, options.warmup, options.timing, samples);
        warm_calls = options.warmup;
        per_call = backend.max_over_ranks(options.warmup > 0 ? t.wall / static_cast<double>(options.warmup) : 0);
      } else {
        // At least two batches, and the estimate is the better of the last two: one batch that was
        // preempted or waited for a peer still asleep (this VM shares its cores) must not cut the
        // timed loop to a few calls.
        const double warm_s = options.target_ms * 1e-3 / 4;
        double previous = 0;
        for (long batch = 1;; batch *= 2) {
          const detail::LoopTime t = detail::time_loop(backend, call, batch, options.timing, samples);
          warm_calls += batch;
          const double slowest = backend.max_over_ranks(t.wall);
          const double this_batch = slowest / static_cast<double>(batch);
          per_call = previous > 0 ? std::min(previous, this_batch) : this_batch;
          if (previous > 0 && (slowest >= warm_s || batch >= options.max_iters)) break;
          previous = this_batch;
        }
      }
      long iters = options.iters;
      if (iters == 0) {
        const double wanted = per_call > 0 ? options.target_ms * 1e-3 / per_call : double(options.max_iters);
        iters = std::clamp(static_cast<long>(std::ceil(wanted)), options.min_iters, options.max_iters);
      }

      const detail::LoopTime t = detail::time_loop(backend, call, iters, options.timing, samples);
      const std::string algorithm = backend.algorithm();  // before max_over_ranks makes its own call
      const double usec = backend.max_over_ranks(t.stat) * 1e6;

      if (options.check) {
        detail::fill(call, rank, world_size);
        backend.barrier();  // no rank may still read an input another rank is refilling
        backend.run(call);
        detail::verify(call, backend.result(call), rank, world_size);
        backend.barrier();
      }
      if (rank == 0) {
        const std::string lib = call.in_place ? base_lib + "-inplace" : base_lib;
        std::fputs(detail::format_row(lib, op, world_size, bytes, usec).c_str(), out);
        std::fflush(out);
        if (options.verbose) {
          std::fprintf(stderr, "%s %s %zu B: %ld warm-up + %ld timed calls%s%s%s\n", lib.c_str(),
                       std::string(op_name(op)).c_str(), bytes, warm_calls, iters, algorithm.empty() ? "" : ", ",
                       algorithm.c_str(), options.check ? ", checked" : "");
        }
      }
    }
  }
  if (out != stdout) std::fclose(out);
}

}  // namespace collective_bench
