// Rank program for the collectives tests: `coll_program MODE [KEY=VALUE...]` under nodalrun.
//
// Every input element is a function of (global rank, index, seed), so every rank can compute every
// other rank's input, and from it the expected result with plain scalar loops written here (never
// nodal's kernels): contributions folded in rank order, f16/bf16 through f32 and rounded once to
// nearest even, integers wrapping, integer avg = 64-bit sum / world_size truncated toward zero.
// A failed check prints what failed (collective, op, dtype, count, variant, rank, first bad index,
// expected and got) and exits 1, which makes nodalrun stop the job with code 1.
//
// Modes (KEY=VALUE options after the mode):
//   matrix    collectives x ops x dtypes x sizes x variants on the world communicator; prints
//             "rank R ok N checks digest D algorithms A in T ms".
//             sizes=0,1,7,1000003,64MiB (elements, or bytes per rank with a B suffix)
//             dtypes=all|bool,u8,... ops=all|sum,... pairs=sum:f32,avg:bf16 (instead of ops x dtypes)
//             colls=all|allreduce,reduce,broadcast,allgather,reduce_scatter,gather,scatter,alltoall
//             api=raw,tensor place=out,in memory=private,shared (their cross product), or
//             variants=raw/out/private,tensor/in/shared; seed=N
//             rotate=1: one variant per (collective, op, dtype, size), taking turns (for big sizes)
//             total=1: a size counts the whole buffer of allgather, reduce_scatter, gather, scatter
//             and alltoall (count = size / world_size), so big sizes cost each rank alike
//   split     sub-communicators: key order, negative colors, nested and overlapping groups, groups
//             made by their members alone (create_group) and its refusals, then the
//             matrix (same options) on groups of color rank % 3, all groups at once.
//   stress    iters=N back-to-back small allreduces, every result checked.
//   mismatch  mismatched count/dtype/op/root across ranks and invalid arguments: UsageError on every
//             rank (for small broadcast, scatter, gather and reduce, whose senders check nothing, at
//             the call or the next one), and the communicator still works after each case.
//   rooted    iters=N small broadcast/scatter/gather/reduce calls with rotating roots, between
//             allreduces, ranks pausing at random so senders run ahead of receivers; every result
//             checked; then senders run ahead while their receivers sleep.
//   mismatch_kind  ranks call different collectives: UsageError on every rank.
//   mixed_place  allreduce of private f32 buffers where rank 0 is in place and the others are not
//             arena=1: rank 0's buffer is in the arena instead (in place), the others' private (in
//             place): the buffers are partly in the arena
//             (1, 20 and 48 MiB): every rank must take the same algorithm; results checked.
//   gather_places  gather of private inputs into a root's output that is private or in the arena
//             (every root in turn; cma's range): results and algorithm printed.
//   reduce_places  reduce of private inputs into a root's output that is private or in the arena
//             (every root in turn; 80 KB and 400 KB of f32): the root's result and the 64
//             elements after it checked, algorithm printed.
//   broadcast_places  broadcast from a private root buffer (every root in turn; 80 KB and 4 MB of
//             f32) into receivers' buffers that are private, in the arena on odd ranks, or on a
//             rank that forbids cma (NODAL_CMA=0 for a communicator split off after it): results
//             and the 64 elements after them checked, algorithm printed.
//   p2p       send/recv: order, every pair, a ring, a burst, mismatches, tensors.
//   part_way  what=gather|reduce|allreduce|broadcast denier=R[,R...] count=N in_place=0|1
//             nonblocking=0|1 (allreduce through iallreduce(...).wait()): rank R makes its own
//             process_vm_readv/writev fail with EPERM (a seccomp filter, as a container's profile
//             would) after a first call (which prints its algorithm), so its cma copy throws
//             nodal::Error part-way through a call while its peers wait for it; it catches the
//             error and goes on. Every call that returns is checked; a rank whose call threw
//             overwrites its buffers at once and checks 50 ms later that no peer wrote them. Every rank prints what its first failing call threw,
//             then what a later call throws ("rank R no seccomp" everywhere if the filter is refused).
//   kill      what=allreduce|allreduce_shared|small|barrier|recv|broadcast|reduce|gather|split victim=R delay_ms=N
//             count=N die=kill|exit: the victim dies (SIGKILL, or _Exit(3)) after delay_ms while the
//             ranks run `what` (each prints the algorithm of its first call); survivors print when
//             PeerFailure reached them and that later calls throw it too.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <nodal/communicator.hpp>
#include <nodal/nodal.hpp>
#include <nodal/sync.hpp>
#include <nodal/tensor.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using nodal::Communicator;
using nodal::DType;
using nodal::ReduceOp;
using nodal::Tensor;
using Clock = std::chrono::steady_clock;

int g_rank = 0;  // the job's rank, for messages

[[noreturn]] void fail(const std::string& what) {
  std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

template <class... Args>
std::string format(const char* fmt, Args... args) {
  char small[256];
  int n = std::snprintf(small, sizeof small, fmt, args...);
  if (n < 0) return fmt;
  if (static_cast<std::size_t>(n) < sizeof small) return std::string(small, static_cast<std::size_t>(n));
  std::vector<char> large(static_cast<std::size_t>(n) + 1);
  std::snprintf(large.data(), large.size(), fmt, args...);
  return std::string(large.data(), static_cast<std::size_t>(n));
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// ---- Names (our own, so a message never depends on the library under test). ----

constexpr DType kAllDtypes[] = {DType::bool_, DType::u8,   DType::i8,  DType::i32, DType::i64,
                                DType::f16,   DType::bf16, DType::f32, DType::f64};
constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

const char* name_of(DType dtype) {
  switch (dtype) {
    case DType::bool_:
      return "bool";
    case DType::u8:
      return "u8";
    case DType::i8:
      return "i8";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
  }
  return "?";
}

const char* name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::bool_:
    case DType::u8:
    case DType::i8:
      return 1;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::i32:
    case DType::f32:
      return 4;
    case DType::i64:
    case DType::f64:
      return 8;
  }
  return 0;
}

// ---- f16 / bf16 <-> f32, round to nearest even (checked exhaustively against GCC's _Float16). ----

[[gnu::always_inline]] inline std::uint16_t f32_to_f16(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);   // NaN
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (abs < 0x38800000u) {                                                    // below 2^-14: subnormal
    std::uint32_t exponent = abs >> 23;
    if (exponent < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: zero
    std::uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    std::uint32_t shift = 126 - exponent;
    std::uint32_t result = mantissa >> shift;
    std::uint32_t rest = mantissa & ((1u << shift) - 1);
    std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  std::uint32_t result = (abs >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  std::uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;  // a carry rounds up the exponent
  return static_cast<std::uint16_t>(sign | result);
}

[[gnu::always_inline]] inline float f16_to_f32(std::uint16_t half) {
  std::uint32_t sign = (half & 0x8000u) << 16;
  std::uint32_t exponent = (half >> 10) & 0x1Fu;
  std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

[[gnu::always_inline]] inline std::uint16_t f32_to_bf16(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

[[gnu::always_inline]] inline float bf16_to_f32(std::uint16_t value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value) << 16);
}

// ---- Element types and the input generator. ----

template <DType D>
struct Elem;
template <>
struct Elem<DType::bool_> {
  using T = std::uint8_t;
};
template <>
struct Elem<DType::u8> {
  using T = std::uint8_t;
};
template <>
struct Elem<DType::i8> {
  using T = std::int8_t;
};
template <>
struct Elem<DType::i32> {
  using T = std::int32_t;
};
template <>
struct Elem<DType::i64> {
  using T = std::int64_t;
};
template <>
struct Elem<DType::f16> {
  using T = std::uint16_t;
};
template <>
struct Elem<DType::bf16> {
  using T = std::uint16_t;
};
template <>
struct Elem<DType::f32> {
  using T = float;
};
template <>
struct Elem<DType::f64> {
  using T = double;
};
template <DType D>
using T_of = typename Elem<D>::T;

template <class F>
decltype(auto) with_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::bool_:
      return f.template operator()<DType::bool_>();
    case DType::u8:
      return f.template operator()<DType::u8>();
    case DType::i8:
      return f.template operator()<DType::i8>();
    case DType::i32:
      return f.template operator()<DType::i32>();
    case DType::i64:
      return f.template operator()<DType::i64>();
    case DType::f16:
      return f.template operator()<DType::f16>();
    case DType::bf16:
      return f.template operator()<DType::bf16>();
    case DType::f32:
      return f.template operator()<DType::f32>();
    case DType::f64:
      return f.template operator()<DType::f64>();
  }
  fail("unknown dtype");
}

[[gnu::always_inline]] inline std::uint64_t mix(std::uint64_t seed, std::uint64_t rank, std::uint64_t index) {
  std::uint64_t z = seed + rank * 0x9E3779B97F4A7C15ULL + index * 0xD1B54A32D192ED03ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Element `index` of the input of the rank whose global rank is `rank`, for a check with `seed`
/// and `op`. Integers span their whole range (sums and products wrap), but prod gets odd numbers
/// at even indices (so products do not all collapse to 0 mod 2^w) and i64 avg stays below 2^59 (so
/// the 64-bit sum is exact). Floats have random mantissas (sums round) and exponents in
/// [2^-2, 2^3), or [2^-1, 2^1) for prod, so nothing overflows, underflows or is zero.
template <DType D>
[[gnu::always_inline]] inline T_of<D> input_value(std::uint64_t seed, int rank, std::uint64_t index, ReduceOp op) {
  std::uint64_t h = mix(seed, static_cast<std::uint64_t>(rank), index);
  bool odd = op == ReduceOp::prod && index % 2 == 0;
  std::uint64_t sign = (h >> 55) & 1;
  std::uint64_t exponent = op == ReduceOp::prod ? (h >> 56) & 1 : (h >> 56) % 5;  // offset from 2^-1 / 2^-2
  std::int64_t shift = op == ReduceOp::prod ? -1 : -2;
  if constexpr (D == DType::bool_) {
    return static_cast<std::uint8_t>(index % 3 == 0 ? (h & 7) != 0 : (h & 1));  // both all-true and any-false
  } else if constexpr (D == DType::u8 || D == DType::i8 || D == DType::i32) {
    return static_cast<T_of<D>>((h >> 16) | (odd ? 1 : 0));
  } else if constexpr (D == DType::i64) {
    std::int64_t v = static_cast<std::int64_t>(h | (odd ? 1 : 0));
    return op == ReduceOp::avg ? v >> 5 : v;
  } else if constexpr (D == DType::f16) {
    return static_cast<std::uint16_t>((sign << 15) | (static_cast<std::uint64_t>(15 + shift) + exponent) << 10 |
                                      (h & 0x3FFu));
  } else if constexpr (D == DType::bf16) {
    return static_cast<std::uint16_t>((sign << 15) | (static_cast<std::uint64_t>(127 + shift) + exponent) << 7 |
                                      (h & 0x7Fu));
  } else if constexpr (D == DType::f32) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(
        (sign << 31) | (static_cast<std::uint64_t>(127 + shift) + exponent) << 23 | (h & 0x7FFFFFu)));
  } else {
    return std::bit_cast<double>((sign << 63) | (static_cast<std::uint64_t>(1023 + shift) + exponent) << 52 |
                                 (h & 0xFFFFFFFFFFFFFULL));
  }
}

/// op over contributions value(0), ..., value(n-1), in that order, as the header specifies.
template <DType D, class Value>
[[gnu::always_inline]] inline T_of<D> fold(ReduceOp op, int n, Value&& value) {
  using T = T_of<D>;
  if constexpr (D == DType::bool_) {
    bool any = false, all = true;
    for (int j = 0; j < n; ++j) {
      bool v = value(j) != 0;
      any |= v;
      all &= v;
    }
    return static_cast<T>(op == ReduceOp::sum || op == ReduceOp::max ? any : all);
  } else if constexpr (std::is_integral_v<T> && D != DType::f16 && D != DType::bf16) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::prod: {
        std::uint64_t acc = static_cast<std::uint64_t>(static_cast<std::int64_t>(value(0)));
        for (int j = 1; j < n; ++j) {
          auto v = static_cast<std::uint64_t>(static_cast<std::int64_t>(value(j)));
          acc = op == ReduceOp::sum ? acc + v : acc * v;  // mod 2^64, then truncated: wraps as T would
        }
        return static_cast<T>(acc);
      }
      case ReduceOp::min:
      case ReduceOp::max: {
        T acc = value(0);
        for (int j = 1; j < n; ++j) {
          T v = value(j);
          acc = op == ReduceOp::min ? (v < acc ? v : acc) : (v > acc ? v : acc);
        }
        return acc;
      }
      case ReduceOp::avg: {
        std::int64_t sum = 0;
        for (int j = 0; j < n; ++j) sum += static_cast<std::int64_t>(value(j));
        return static_cast<T>(sum / n);  // C++ division truncates toward zero
      }
    }
    return T{};
  } else {
    // Floating point: f16 and bf16 widened to f32, the accumulator is f32 for them and f32, f64 for f64.
    using Acc = std::conditional_t<D == DType::f64, double, float>;
    auto widen = [](T v) -> Acc {
      if constexpr (D == DType::f16) return f16_to_f32(v);
      if constexpr (D == DType::bf16) return bf16_to_f32(v);
      if constexpr (D == DType::f32 || D == DType::f64) return v;
    };
    Acc acc = widen(value(0));
    for (int j = 1; j < n; ++j) {
      Acc v = widen(value(j));
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          acc = acc + v;
          break;
        case ReduceOp::prod:
          acc = acc * v;
          break;
        case ReduceOp::min:
          acc = v < acc ? v : acc;
          break;
        case ReduceOp::max:
          acc = v > acc ? v : acc;
          break;
      }
    }
    if (op == ReduceOp::avg) acc = acc / static_cast<Acc>(n);
    if constexpr (D == DType::f16) return f32_to_f16(acc);
    if constexpr (D == DType::bf16) return f32_to_bf16(acc);
    if constexpr (D == DType::f32 || D == DType::f64) return acc;
  }
}

template <DType D>
std::string show(T_of<D> v) {
  if constexpr (D == DType::f16) return format("%.9g (0x%04x)", static_cast<double>(f16_to_f32(v)), v);
  if constexpr (D == DType::bf16) return format("%.9g (0x%04x)", static_cast<double>(bf16_to_f32(v)), v);
  if constexpr (D == DType::f32)
    return format("%.9g (0x%08x)", static_cast<double>(v), std::bit_cast<std::uint32_t>(v));
  if constexpr (D == DType::f64) return format("%.17g (0x%016" PRIx64 ")", v, std::bit_cast<std::uint64_t>(v));
  if constexpr (D == DType::u8 || D == DType::bool_) return format("%u", static_cast<unsigned>(v));
  if constexpr (D == DType::i8 || D == DType::i32 || D == DType::i64) return format("%lld", static_cast<long long>(v));
}

std::uint64_t hash_bytes(const void* data, std::size_t bytes, std::uint64_t h = 0x6A09E667F3BCC908ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ULL;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
  return h ^ (bytes * 0x9E3779B97F4A7C15ULL);
}

// ---- Options. ----

struct SizeSpec {
  std::size_t value = 0;
  bool bytes = false;  ///< "64MiB": bytes per rank, elements = bytes / element size
  std::size_t count(DType dtype) const { return bytes ? value / size_of(dtype) : value; }
};

std::vector<std::string> split_list(const std::string& text, char sep = ',') {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::size_t parse_size_number(const std::string& text, bool* bytes) {
  std::size_t pos = 0;
  std::size_t value = std::stoull(text, &pos);
  std::string suffix = text.substr(pos);
  *bytes = !suffix.empty() && suffix.back() == 'B';
  if (*bytes) suffix.pop_back();
  if (suffix == "Ki" || suffix == "K")
    value <<= 10;
  else if (suffix == "Mi" || suffix == "M")
    value <<= 20;
  else if (!suffix.empty())
    throw std::invalid_argument("bad size " + text);
  return value;
}

DType parse_dtype(const std::string& name) {
  for (DType d : kAllDtypes) {
    if (name == name_of(d)) return d;
  }
  throw std::invalid_argument("bad dtype " + name);
}

ReduceOp parse_op(const std::string& name) {
  for (ReduceOp op : kAllOps) {
    if (name == name_of(op)) return op;
  }
  throw std::invalid_argument("bad op " + name);
}

enum class Coll { allreduce, reduce, broadcast, allgather, reduce_scatter, gather, scatter, alltoall };
constexpr Coll kAllColls[] = {Coll::allreduce,      Coll::reduce, Coll::broadcast, Coll::allgather,
                              Coll::reduce_scatter, Coll::gather, Coll::scatter,   Coll::alltoall};
const char* name_of(Coll c) {
  static const char* names[] = {"allreduce",      "reduce", "broadcast", "allgather",
                                "reduce_scatter", "gather", "scatter",   "alltoall"};
  return names[static_cast<int>(c)];
}
bool reduces(Coll c) { return c == Coll::allreduce || c == Coll::reduce || c == Coll::reduce_scatter; }
/// Collectives whose buffers hold world_size blocks of count elements.
bool is_vector(Coll c) {
  return c == Coll::allgather || c == Coll::reduce_scatter || c == Coll::gather || c == Coll::scatter ||
         c == Coll::alltoall;
}

struct Variant {
  bool tensor = false;    ///< Tensor API (else raw pointers)
  bool in_place = false;  ///< same buffer as input and output
  bool shared = false;    ///< buffers in the job arena (Tensor::empty_shared)
  std::string name() const {
    return std::string(tensor ? "tensor" : "raw") + "/" + (in_place ? "in" : "out") + "/" +
           (shared ? "shared" : "private");
  }
};

struct Options {
  std::vector<SizeSpec> sizes = {{0}, {1}, {7}};
  std::vector<DType> dtypes{std::begin(kAllDtypes), std::end(kAllDtypes)};
  std::vector<ReduceOp> ops{std::begin(kAllOps), std::end(kAllOps)};
  std::vector<std::pair<ReduceOp, DType>> pairs;  ///< when set: only these (op, dtype), reducing collectives only
  std::vector<Coll> colls{std::begin(kAllColls), std::end(kAllColls)};
  std::vector<Variant> variants;
  std::uint64_t seed = 1;
  bool rotate = false;  ///< one variant per (collective, op, dtype, size), taking turns, not every one
  bool total = false;   ///< sizes count a vector collective's whole buffer: count = size / world_size
  std::map<std::string, std::string> extra;  ///< mode-specific keys

  long get(const std::string& key, long fallback) const {
    auto it = extra.find(key);
    return it == extra.end() ? fallback : std::stol(it->second);
  }
  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = extra.find(key);
    return it == extra.end() ? fallback : it->second;
  }
};

Options parse_options(int argc, char** argv) {
  Options o;
  std::vector<bool> apis = {false, true}, places = {false, true}, memories = {false, true};
  std::vector<Variant> explicit_variants;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto eq = arg.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("expected KEY=VALUE, got " + arg);
    std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "sizes") {
      o.sizes.clear();
      for (const auto& s : split_list(value)) {
        SizeSpec spec;
        spec.value = parse_size_number(s, &spec.bytes);
        o.sizes.push_back(spec);
      }
    } else if (key == "dtypes") {
      if (value != "all") {
        o.dtypes.clear();
        for (const auto& s : split_list(value)) o.dtypes.push_back(parse_dtype(s));
      }
    } else if (key == "ops") {
      if (value != "all") {
        o.ops.clear();
        for (const auto& s : split_list(value)) o.ops.push_back(parse_op(s));
      }
    } else if (key == "pairs") {
      for (const auto& s : split_list(value)) {
        auto parts = split_list(s, ':');
        if (parts.size() != 2) throw std::invalid_argument("bad pair " + s);
        o.pairs.emplace_back(parse_op(parts[0]), parse_dtype(parts[1]));
      }
    } else if (key == "colls") {
      if (value != "all") {
        o.colls.clear();
        for (const auto& s : split_list(value)) {
          bool found = false;
          for (Coll c : kAllColls) {
            if (s == name_of(c)) o.colls.push_back(c), found = true;
          }
          if (!found) throw std::invalid_argument("bad collective " + s);
        }
      }
    } else if (key == "api" || key == "place" || key == "memory") {
      std::vector<bool>& axis = key == "api" ? apis : key == "place" ? places : memories;
      const char* second = key == "api" ? "tensor" : key == "place" ? "in" : "shared";
      axis.clear();
      for (const auto& s : split_list(value)) axis.push_back(s == second);
    } else if (key == "variants") {  // explicit combinations: raw/out/private,tensor/in/shared
      apis.clear(), places.clear(), memories.clear();
      for (const auto& s : split_list(value)) {
        auto parts = split_list(s, '/');
        if (parts.size() != 3) throw std::invalid_argument("bad variant " + s);
        explicit_variants.push_back({parts[0] == "tensor", parts[1] == "in", parts[2] == "shared"});
      }
    } else if (key == "seed") {
      o.seed = std::stoull(value);
    } else if (key == "rotate" || key == "total") {
      (key == "rotate" ? o.rotate : o.total) = value == "1";
    } else {
      o.extra[key] = value;
    }
  }
  o.variants = explicit_variants;
  for (bool memory : memories) {
    for (bool api : apis) {
      for (bool place : places) o.variants.push_back({api, place, memory});
    }
  }
  return o;
}

// ---- The matrix. ----

Tensor alloc(std::size_t count, DType dtype, bool shared) {
  std::vector<std::int64_t> shape = {static_cast<std::int64_t>(count)};
  return shared ? Tensor::empty_shared(shape, dtype) : Tensor::empty(shape, dtype);
}

constexpr unsigned char kSentinel = 0xA5;
/// Outputs up to this many elements are checked whole on every rank; larger ones that must be the
/// same on every rank are checked in slices (rank r its r-th) and compared across ranks by hash.
constexpr std::size_t kWholeCheck = std::size_t{1} << 16;

class Matrix {
 public:
  Matrix(Communicator comm, const Options& options, std::string label)
      : comm_(std::move(comm)), o_(options), label_(std::move(label)) {
    n_ = comm_.world_size();
    r_ = comm_.rank();
    for (int j = 0; j < n_; ++j) members_.push_back(comm_.global_rank(j));
  }

  /// Runs every check; returns the summary line.
  std::string run() {
    auto start = Clock::now();
    for (const SizeSpec& size : o_.sizes) {
      for (DType dtype : o_.dtypes) {
        for (Coll coll : o_.colls) {
          std::size_t count = size.count(dtype);
          if (o_.total && is_vector(coll) && count > 0) count = std::max<std::size_t>(1, count / n_);
          if (!reduces(coll)) {
            if (o_.pairs.empty()) for_variants(coll, ReduceOp::sum, dtype, count);
            continue;
          }
          for (ReduceOp op : o_.ops) {
            if (!o_.pairs.empty() &&
                std::find(o_.pairs.begin(), o_.pairs.end(), std::make_pair(op, dtype)) == o_.pairs.end()) {
              continue;
            }
            if (dtype == DType::bool_ && op == ReduceOp::avg) continue;  // a UsageError: see mismatch mode
            for_variants(coll, op, dtype, count);
          }
        }
      }
    }
    compare_hashes_across_ranks();
    std::string algos;
    for (const auto& [key, n] : algorithms_) algos += (algos.empty() ? "" : ",") + key + "=" + std::to_string(n);
    return format("%s ok %d checks digest %016" PRIx64 " algorithms %s in %.0f ms", label_.c_str(), checks_, digest_,
                  algos.empty() ? "-" : algos.c_str(), ms_since(start));
  }

 private:
  struct Check {
    Coll coll;
    ReduceOp op;
    DType dtype;
    std::size_t count;
    Variant variant;
    int root;
    std::uint64_t seed;
    std::string describe() const {
      std::string s = format("%s", name_of(coll));
      if (reduces(coll)) s += format(" %s", name_of(op));
      s += format(" %s count=%zu %s", name_of(dtype), count, variant.name().c_str());
      if (coll == Coll::reduce || coll == Coll::broadcast || coll == Coll::gather || coll == Coll::scatter) {
        s += format(" root=%d", root);
      }
      return s;
    }
  };

  void for_variants(Coll coll, ReduceOp op, DType dtype, std::size_t count) {
    bool has_in_place = coll == Coll::allreduce || coll == Coll::reduce || coll == Coll::allgather ||
                        coll == Coll::reduce_scatter || coll == Coll::broadcast;
    std::vector<Variant> variants;
    for (const Variant& v : o_.variants) {
      if (v.in_place && !has_in_place) continue;
      if (!v.in_place && coll == Coll::broadcast) continue;           // broadcast is in place only
      if (!v.in_place && coll == Coll::reduce && v.tensor) continue;  // so is reduce(Tensor&)
      variants.push_back(v);
    }
    if (o_.rotate && !variants.empty()) {  // one variant per combination, taking turns
      Variant v = variants[static_cast<std::size_t>(combinations_[static_cast<int>(coll)]++) % variants.size()];
      variants = {v};
    }
    for (const Variant& v : variants) {
      Check c{coll, op, dtype, count, v, checks_ % n_, mix(o_.seed, 0xC0FFEE, static_cast<std::uint64_t>(checks_))};
      with_dtype(dtype, [&]<DType D>() { run_check<D>(c); });
      ++checks_;
    }
  }

  /// A tensor of count elements for buffer `slot` (0: input, 1: output). Large ones are views of
  /// one reused buffer per slot and memory kind, so that big runs do not pay a fresh allocation's
  /// page faults at every check; small ones are fresh each time (the library sees many addresses).
  Tensor buffer(int slot, std::size_t count, DType dtype, bool shared) {
    std::size_t bytes = count * size_of(dtype);
    if (bytes < (std::size_t{1} << 20)) return alloc(count, dtype, shared);
    Tensor& cached = pool_[slot][shared ? 1 : 0];
    if (!cached.defined() || cached.nbytes() < bytes) {
      cached = Tensor();
      cached = alloc(bytes, DType::u8, shared);
    }
    return Tensor(cached.storage(), cached.storage_offset(), {static_cast<std::int64_t>(count)}, {1}, dtype);
  }

  template <DType D>
  void run_check(const Check& c) {
    using T = T_of<D>;
    const std::size_t count = c.count, n = static_cast<std::size_t>(n_);
    auto input_of = [&](int j, std::size_t index) {
      return input_value<D>(c.seed, members_[static_cast<std::size_t>(j)], index, c.op);
    };
    auto fill_input = [&](void* dst, int j, std::size_t begin, std::size_t elements) {
      T* p = static_cast<T*>(dst);
      for (std::size_t k = 0; k < elements; ++k) p[k] = input_of(j, begin + k);
    };
    auto reduced = [&](std::size_t index) { return fold<D>(c.op, n_, [&](int j) { return input_of(j, index); }); };
    auto sentinel = [](const Tensor& t) {
      if (t.nbytes()) std::memset(t.data(), kSentinel, t.nbytes());
    };
    auto is_sentinel = [&](const Tensor& t, const char* what) {
      const auto* p = static_cast<const unsigned char*>(t.data());
      for (std::size_t i = 0; i < t.nbytes(); ++i) {
        if (p[i] != kSentinel)
          fail(format("%s on %s: %s was written (byte %zu)", c.describe().c_str(), label_.c_str(), what, i));
      }
    };
    // Compares got[begin, end) with expected(index); reports the first difference and how many.
    auto verify = [&](const Tensor& t, std::size_t offset, std::size_t begin, std::size_t end, auto&& expected,
                      const char* what) {
      const T* got = static_cast<const T*>(t.data()) + offset;
      std::size_t bad = 0, first = 0;
      T first_expected{}, first_got{};
      for (std::size_t k = begin; k < end; ++k) {
        T e = expected(k);
        if (std::memcmp(&e, &got[k], sizeof(T)) != 0) {
          if (bad++ == 0) first = k, first_expected = e, first_got = got[k];
        }
      }
      if (bad) {
        fail(format("%s on %s (rank %d of %d): %s: %zu of [%zu, %zu) wrong, first at index %zu: expected %s got %s",
                    c.describe().c_str(), label_.c_str(), r_, n_, what, bad, begin, end, first,
                    show<D>(first_expected).c_str(), show<D>(first_got).c_str()));
      }
    };
    auto my_slice = [&](std::size_t total) -> std::pair<std::size_t, std::size_t> {
      if (total <= kWholeCheck) return {0, total};
      return {total * static_cast<std::size_t>(r_) / n, total * static_cast<std::size_t>(r_ + 1) / n};
    };
    auto same_everywhere = [&](const Tensor& t) {
      std::uint64_t h = hash_bytes(t.data(), t.nbytes());
      hashes_.push_back(static_cast<std::int64_t>(h));
      hash_names_.push_back(c.describe());
      digest_ = hash_bytes(&h, sizeof h, digest_);
    };
    auto own_result = [&](const Tensor& t, std::size_t offset, std::size_t elements) {
      const auto* p = static_cast<const T*>(t.data()) + offset;
      digest_ = hash_bytes(p, elements * sizeof(T), digest_);
    };
    auto input_unchanged = [&](const Tensor& t, std::uint64_t before) {
      if (hash_bytes(t.data(), t.nbytes()) != before) fail(c.describe() + " on " + label_ + ": the input was modified");
    };
    auto note_algorithm = [&]() {
      if (c.count == 0 || n_ == 1) return;
      algorithms_[std::string(c.variant.shared ? "shared:" : "private:") + comm_.last_algorithm()] += 1;
    };
    const Variant& v = c.variant;
    const bool root = r_ == c.root;
    const std::size_t rank_offset = static_cast<std::size_t>(r_) * count;

    switch (c.coll) {
      case Coll::allreduce: {
        Tensor in = buffer(0, count, c.dtype, v.shared);
        fill_input(in.data(), r_, 0, count);
        Tensor out = v.in_place ? in : buffer(1, count, c.dtype, v.shared);
        if (!v.in_place) sentinel(out);
        std::uint64_t before = hash_bytes(in.data(), in.nbytes());
        if (v.tensor) {
          if (v.in_place)
            comm_.allreduce(in, c.op);
          else
            comm_.allreduce(in, out, c.op);
        } else {
          comm_.allreduce(in.data(), out.data(), count, c.dtype, c.op);
        }
        note_algorithm();
        if (!v.in_place) input_unchanged(in, before);
        auto [b, e] = my_slice(count);
        verify(out, 0, b, e, reduced, "output");
        same_everywhere(out);
        break;
      }
      case Coll::reduce: {
        Tensor in = buffer(0, count, c.dtype, v.shared);
        fill_input(in.data(), r_, 0, count);
        // Out of place, a non-root passes nullptr at odd checks and a buffer that must stay untouched at even ones.
        bool null_output = !v.in_place && !root && checks_ % 2 == 1;
        Tensor out = v.in_place ? in : null_output ? Tensor() : buffer(1, count, c.dtype, v.shared);
        if (!v.in_place && !null_output) sentinel(out);
        std::uint64_t before = hash_bytes(in.data(), in.nbytes());
        if (v.tensor)
          comm_.reduce(in, c.op, c.root);
        else
          comm_.reduce(in.data(), null_output ? nullptr : out.data(), count, c.dtype, c.op, c.root);
        note_algorithm();
        if (root) {
          if (!v.in_place) input_unchanged(in, before);
          verify(out, 0, 0, count, reduced, "root's output");
          own_result(out, 0, count);
        } else if (v.in_place) {
          verify(
              in, 0, 0, count, [&](std::size_t k) { return input_of(r_, k); }, "non-root's buffer (must stay)");
        } else {
          input_unchanged(in, before);
          if (!null_output) is_sentinel(out, "non-root's output");
        }
        break;
      }
      case Coll::broadcast: {
        Tensor buf = buffer(0, count, c.dtype, v.shared);
        if (root)
          fill_input(buf.data(), c.root, 0, count);
        else
          sentinel(buf);
        if (v.tensor)
          comm_.broadcast(buf, c.root);
        else
          comm_.broadcast(buf.data(), count, c.dtype, c.root);
        note_algorithm();
        auto [b, e] = my_slice(count);
        verify(
            buf, 0, b, e, [&](std::size_t k) { return input_of(c.root, k); }, "buffer");
        same_everywhere(buf);
        break;
      }
      case Coll::allgather: {
        Tensor out = buffer(1, n * count, c.dtype, v.shared);
        sentinel(out);
        Tensor in;
        if (v.in_place) {
          in = out.slice(static_cast<std::int64_t>(rank_offset), static_cast<std::int64_t>(rank_offset + count));
        } else {
          in = buffer(0, count, c.dtype, v.shared);
        }
        fill_input(in.data(), r_, 0, count);
        std::uint64_t before = hash_bytes(in.data(), in.nbytes());
        if (v.tensor)
          comm_.allgather(in, out);
        else
          comm_.allgather(in.data(), out.data(), count, c.dtype);
        note_algorithm();
        if (!v.in_place) input_unchanged(in, before);
        auto [b, e] = my_slice(n * count);
        verify(
            out, 0, b, e, [&](std::size_t k) { return input_of(static_cast<int>(k / count), k % count); }, "output");
        same_everywhere(out);
        break;
      }
      case Coll::reduce_scatter: {
        Tensor in = buffer(0, n * count, c.dtype, v.shared);
        fill_input(in.data(), r_, 0, n * count);
        Tensor out;
        if (v.in_place) {
          out = in.slice(static_cast<std::int64_t>(rank_offset), static_cast<std::int64_t>(rank_offset + count));
        } else {
          out = buffer(1, count, c.dtype, v.shared);
          sentinel(out);
        }
        std::uint64_t before = hash_bytes(in.data(), in.nbytes());
        if (v.tensor)
          comm_.reduce_scatter(in, out, c.op);
        else
          comm_.reduce_scatter(in.data(), out.data(), count, c.dtype, c.op);
        note_algorithm();
        if (!v.in_place) input_unchanged(in, before);
        verify(
            out, 0, 0, count, [&](std::size_t k) { return reduced(rank_offset + k); }, "output block");
        own_result(out, 0, count);
        break;
      }
      case Coll::gather: {
        Tensor in = buffer(0, count, c.dtype, v.shared);
        fill_input(in.data(), r_, 0, count);
        bool null_output = !root && !v.tensor && checks_ % 2 == 1;
        Tensor out = null_output ? Tensor() : buffer(1, n * count, c.dtype, v.shared);
        if (!null_output) sentinel(out);
        std::uint64_t before = hash_bytes(in.data(), in.nbytes());
        if (v.tensor)
          comm_.gather(in, out, c.root);
        else
          comm_.gather(in.data(), null_output ? nullptr : out.data(), count, c.dtype, c.root);
        note_algorithm();
        input_unchanged(in, before);
        if (root) {
          verify(
              out, 0, 0, n * count, [&](std::size_t k) { return input_of(static_cast<int>(k / count), k % count); },
              "root's output");
          own_result(out, 0, n * count);
        } else if (!null_output) {
          is_sentinel(out, "non-root's output");
        }
        break;
      }
      case Coll::scatter: {
        bool null_input = !root && !v.tensor && checks_ % 2 == 1;
        Tensor in = null_input ? Tensor() : buffer(0, n * count, c.dtype, v.shared);
        if (root)
          fill_input(in.data(), c.root, 0, n * count);
        else if (!null_input)
          sentinel(in);
        Tensor out = buffer(1, count, c.dtype, v.shared);
        sentinel(out);
        std::uint64_t before = null_input ? 0 : hash_bytes(in.data(), in.nbytes());
        if (v.tensor)
          comm_.scatter(in, out, c.root);
        else
          comm_.scatter(null_input ? nullptr : in.data(), out.data(), count, c.dtype, c.root);
        note_algorithm();
        if (!null_input) input_unchanged(in, before);
        verify(
            out, 0, 0, count, [&](std::size_t k) { return input_of(c.root, rank_offset + k); }, "output");
        own_result(out, 0, count);
        break;
      }
      case Coll::alltoall: {
        Tensor in = buffer(0, n * count, c.dtype, v.shared);
        fill_input(in.data(), r_, 0, n * count);
        Tensor out = buffer(1, n * count, c.dtype, v.shared);
        sentinel(out);
        std::uint64_t before = hash_bytes(in.data(), in.nbytes());
        if (v.tensor)
          comm_.alltoall(in, out);
        else
          comm_.alltoall(in.data(), out.data(), count, c.dtype);
        note_algorithm();
        input_unchanged(in, before);
        verify(
            out, 0, 0, n * count,
            [&](std::size_t k) { return input_of(static_cast<int>(k / count), rank_offset + k % count); }, "output");
        own_result(out, 0, n * count);
        break;
      }
    }
  }

  /// The results that must be the same on every rank were checked here only in this rank's slice:
  /// their hashes, gathered from every rank (with the allgather just verified), must agree.
  void compare_hashes_across_ranks() {
    std::size_t h = hashes_.size();
    if (h == 0 || n_ == 1) return;
    std::vector<std::int64_t> all(h * static_cast<std::size_t>(n_));
    comm_.allgather(hashes_.data(), all.data(), h, DType::i64);
    for (std::size_t i = 0; i < h; ++i) {
      for (int j = 0; j < n_; ++j) {
        if (all[static_cast<std::size_t>(j) * h + i] != hashes_[i]) {
          fail(format("%s on %s: rank %d's result differs from rank %d's (hash %016" PRIx64 " vs %016" PRIx64 ")",
                      hash_names_[i].c_str(), label_.c_str(), r_, j, static_cast<std::uint64_t>(hashes_[i]),
                      static_cast<std::uint64_t>(all[static_cast<std::size_t>(j) * h + i])));
        }
      }
    }
  }

  Communicator comm_;
  const Options& o_;
  std::string label_;
  int n_ = 1;
  int r_ = 0;
  std::vector<int> members_;
  int checks_ = 0;
  std::uint64_t digest_ = 0;
  std::vector<std::int64_t> hashes_;
  std::vector<std::string> hash_names_;
  std::map<std::string, int> algorithms_;
  int combinations_[8] = {};
  Tensor pool_[2][2];
};

int matrix(const nodal::Context& ctx, const Options& o) {
  std::string line = Matrix(ctx.world(), o, format("rank %d", ctx.rank())).run();
  std::printf("%s\n", line.c_str());
  return 0;
}

// ---- Sub-communicators. ----

/// An in-place i64 sum of (global rank + 1) * (salt + 1) + index over `comm`, checked.
void checked_allreduce(Communicator& comm, std::int64_t salt, std::size_t count, const std::string& what) {
  std::vector<std::int64_t> buf(count);
  int me = comm.global_rank(comm.rank());
  for (std::size_t i = 0; i < count; ++i) buf[i] = (me + 1) * (salt + 1) + static_cast<std::int64_t>(i);
  comm.allreduce(buf.data(), buf.data(), count, DType::i64, ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t expected = 0;
    for (int j = 0; j < comm.world_size(); ++j)
      expected += (comm.global_rank(j) + 1) * (salt + 1) + static_cast<std::int64_t>(i);
    if (buf[i] != expected) {
      fail(format("%s: allreduce of %zu i64 element %zu: expected %lld got %lld", what.c_str(), count, i,
                  static_cast<long long>(expected), static_cast<long long>(buf[i])));
    }
  }
}

/// Checks a communicator's members: `expected` lists its global ranks in communicator-rank order.
void check_members(const Communicator& comm, const std::vector<int>& expected, int me, const std::string& what) {
  if (!comm.valid()) fail(what + ": invalid communicator");
  auto pos = std::find(expected.begin(), expected.end(), me) - expected.begin();
  if (comm.world_size() != static_cast<int>(expected.size()) || comm.rank() != pos) {
    fail(format("%s: rank %d of %d, expected %d of %zu", what.c_str(), comm.rank(), comm.world_size(),
                static_cast<int>(pos), expected.size()));
  }
  for (int j = 0; j < comm.world_size(); ++j) {
    if (comm.global_rank(j) != expected[static_cast<std::size_t>(j)]) {
      fail(format("%s: global_rank(%d) = %d, expected %d", what.c_str(), j, comm.global_rank(j),
                  expected[static_cast<std::size_t>(j)]));
    }
  }
}

int split_mode(const nodal::Context& ctx, const Options& o) {
  Communicator world = ctx.world();
  const int n = world.world_size(), r = world.rank();
  check_members(
      world,
      [&] {
        std::vector<int> all(static_cast<std::size_t>(n));
        for (int j = 0; j < n; ++j) all[static_cast<std::size_t>(j)] = j;
        return all;
      }(),
      r, "world");

  // Keys order the new ranks: key = -rank reverses them.
  Communicator reversed = world.split(r % 2, -r);
  std::vector<int> expected;
  for (int j = n - 1; j >= 0; --j) {
    if (j % 2 == r % 2) expected.push_back(j);
  }
  check_members(reversed, expected, r, "split(rank % 2, -rank)");
  checked_allreduce(reversed, 1, 3, "reversed group");

  // Equal keys keep the parent's order.
  Communicator same = world.split(7, 0);
  expected.clear();
  for (int j = 0; j < n; ++j) expected.push_back(j);
  check_members(same, expected, r, "split(7, 0)");
  checked_allreduce(same, 2, 5, "split(7, 0)");

  // A negative color: that rank gets an invalid communicator, the others one without it.
  Communicator without_last = world.split(r == n - 1 ? -1 : 0, r);
  if (r == n - 1) {
    if (without_last.valid()) fail("split(-1, key) returned a valid communicator");
  } else {
    expected.clear();
    for (int j = 0; j < n - 1; ++j) expected.push_back(j);
    check_members(without_last, expected, r, "split without the last rank");
    checked_allreduce(without_last, 3, 1000, "group without the last rank");
  }

  // Overlapping groups used in turn, with the world in between.
  Communicator by_parity = world.split(r % 2, r);
  Communicator by_pair = world.split(r / 2, r);
  for (int round = 0; round < 20; ++round) {
    checked_allreduce(by_parity, 10 + round, 1 + static_cast<std::size_t>(round), "parity group");
    checked_allreduce(by_pair, 40 + round, 33, "pair group");
    checked_allreduce(world, 70 + round, 2, "world between groups");
  }

  // A split of a split.
  Communicator nested = by_parity.split(by_parity.rank() / 2, by_parity.rank());
  expected.clear();
  for (int j = 0; j < n; ++j) {
    if (j % 2 == r % 2 && (j / 2) / 2 == (r / 2) / 2) expected.push_back(j);
  }
  check_members(nested, expected, r, "nested split");
  checked_allreduce(nested, 5, 17, "nested group");

  // Groups made by their members alone (create_group, MPI_Comm_create_group). Ranks 0 and 1 make a
  // pair and use it while every other rank goes straight on to the world's allreduce, which then
  // waits for them: a collective create would deadlock here.
  Communicator pair;
  if (n >= 2 && r < 2) {
    pair = world.create_group({1, 0}, "pair");
    check_members(pair, {1, 0}, r, "create_group({1, 0})");
    checked_allreduce(pair, 7, 9, "pair group made by its members");
  }
  checked_allreduce(world, 8, 3, "world after the members-only pair");
  // The even ranks make a group while the odd ranks make theirs, listed in reverse; the same set
  // twice gives two communicators, used in turn.
  std::vector<int> mates;
  for (int j = 0; j < n; ++j) {
    if (j % 2 == r % 2) mates.push_back(j);
  }
  if (r % 2 == 1) std::reverse(mates.begin(), mates.end());
  Communicator first = world.create_group(mates);
  Communicator second = world.create_group(mates);
  check_members(first, mates, r, "create_group(parity)");
  check_members(second, mates, r, "create_group(parity) again");
  for (int round = 0; round < 10; ++round) {
    checked_allreduce(first, 200 + round, 5, "parity group made by its members");
    checked_allreduce(second, 300 + round, 1 + static_cast<std::size_t>(round), "second parity group");
  }
  // Bad lists are refused on the calling rank alone.
  auto refused = [&](const std::vector<int>& ranks, const char* words, const char* what) {
    try {
      (void)world.create_group(ranks, "bad");
    } catch (const nodal::UsageError& e) {
      if (std::string(e.what()).find(words) == std::string::npos) fail(format("%s: wrong message: %s", what, e.what()));
      return;
    }
    fail(format("%s: no UsageError", what));
  };
  refused({}, "empty", "create_group({})");
  refused({r, r}, "listed twice", "create_group({r, r})");
  refused({r, n}, "is not a rank", "create_group({r, n})");
  if (n >= 2) refused({(r + 1) % n}, "only members make a group", "create_group without this rank");
  // Members listing one set in different orders: the second to open it gets UsageError.
  if (n >= 2 && r < 2) {
    int refusals = 0;
    try {
      (void)world.create_group(r == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0}, "order");
    } catch (const nodal::UsageError& e) {
      if (std::string(e.what()).find("different orders") == std::string::npos) fail(format("order: %s", e.what()));
      refusals = 1;
    }
    std::int32_t total = refusals;
    pair.allreduce(&total, &total, 1, DType::i32, ReduceOp::sum);
    if (total != 1) fail(format("order: %d of the two members got UsageError, expected 1", total));
  }

  // Communicators made and dropped again and again.
  for (int i = 0; i < 8; ++i) {
    Communicator temporary = world.split(i % 2 == 0 ? 0 : r % 2, r);
    checked_allreduce(temporary, 100 + i, 4, "temporary group");
  }

  // The matrix in every group of color rank % 3 at once: groups of different sizes run concurrently.
  Communicator group = world.split(r % 3, r);
  Options group_options = o;
  group_options.seed = o.seed * 31 + static_cast<std::uint64_t>(r % 3);
  std::string line = Matrix(group, group_options,
                            format("rank %d color %d (rank %d of %d)", r, r % 3, group.rank(), group.world_size()))
                         .run();
  checked_allreduce(world, 999, 64, "world after the groups");
  std::printf("%s\n", line.c_str());
  std::printf("rank %d split ok\n", r);
  return 0;
}

// ---- Back-to-back small allreduces. ----

int stress(const nodal::Context& ctx, const Options& o) {
  Communicator world = ctx.world();
  const long iters = o.get("iters", 100000);
  const int n = world.world_size(), r = world.rank();
  std::int64_t in[4], out[4];
  float fin[4], fout[4];
  auto value = [](long k, int rank, int i) { return static_cast<std::int64_t>((k * 7 + rank * 3 + i) & 0xFFFF); };
  auto start = Clock::now();
  for (long k = 0; k < iters; ++k) {
    int count = 1 + static_cast<int>(k % 4);
    for (int i = 0; i < count; ++i) in[i] = value(k, r, i), fin[i] = static_cast<float>(value(k, r, i));
    // i64 in place, i64 out of place, f32 out of place (the sums are exact in f32).
    int kind = static_cast<int>(k % 3);
    if (kind == 0)
      world.allreduce(in, in, static_cast<std::size_t>(count), DType::i64, ReduceOp::sum);
    else if (kind == 1)
      world.allreduce(in, out, static_cast<std::size_t>(count), DType::i64, ReduceOp::sum);
    else
      world.allreduce(fin, fout, static_cast<std::size_t>(count), DType::f32, ReduceOp::sum);
    for (int i = 0; i < count; ++i) {
      std::int64_t expected = 0;
      for (int j = 0; j < n; ++j) expected += value(k, j, i);
      std::int64_t got = kind == 0 ? in[i] : kind == 1 ? out[i] : static_cast<std::int64_t>(fout[i]);
      if (got != expected) {
        fail(format("stress allreduce #%ld (count %d, %s): element %d expected %lld got %lld", k, count,
                    kind == 2 ? "f32" : "i64", i, static_cast<long long>(expected), static_cast<long long>(got)));
      }
    }
  }
  double ms = ms_since(start);
  std::printf("rank %d stress ok %ld allreduces in %.0f ms (%.2f us each), algorithm %s\n", r, iters, ms,
              ms * 1000.0 / static_cast<double>(iters ? iters : 1), world.last_algorithm().c_str());
  return 0;
}

// ---- Small rooted calls: senders post and return (credits keep them up to slot depth - 1 calls ahead). ----

int rooted(const nodal::Context& ctx, const Options& o) {
  Communicator world = ctx.world();
  const long iters = o.get("iters", 20000);
  const int n = world.world_size(), r = world.rank();
  std::mt19937_64 calls(12345);           // the same sequence of calls on every rank
  std::mt19937_64 pauses(777 + static_cast<unsigned>(r));  // this rank's own pauses
  const int most = 16;
  std::vector<std::int32_t> in(static_cast<std::size_t>(most * n)), out(static_cast<std::size_t>(most * n));
  auto value = [](long k, int rank, int i) { return static_cast<std::int32_t>((k * 131 + rank * 17 + i) & 0xFFFFF); };
  auto expect = [&](long k, const char* what, std::int32_t got, std::int32_t wanted, int i) {
    if (got != wanted) fail(format("rooted call %ld (%s): element %d expected %d got %d", k, what, i, wanted, got));
  };
  int burst_kind = 0, burst_root = 0;
  for (long k = 0; k < iters; ++k) {
    // Every 500 calls a burst of 150 alike, its receivers pausing first: senders get as far ahead
    // as the credits let them (the slot depth, at most 64), and past it they must wait.
    const bool burst = k % 500 < 150;
    if (k % 500 == 0) {
      burst_kind = static_cast<int>(calls() % 8);
      burst_root = static_cast<int>(calls() % static_cast<unsigned>(n));
      const bool sender = (burst_kind <= 3) == (r == burst_root);  // broadcast, scatter: the root
      if (!sender) std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
    const int kind = burst ? burst_kind : static_cast<int>(calls() % 9);
    const int root = burst ? burst_root : static_cast<int>(calls() % static_cast<unsigned>(n));
    const int count = 1 + static_cast<int>(calls() % most);
    const auto c = static_cast<std::size_t>(count);
    if (pauses() % 32 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // peers run ahead
    if (kind <= 1) {  // broadcast
      for (int i = 0; i < count; ++i) in[i] = r == root ? value(k, root, i) : -1;
      world.broadcast(in.data(), c, DType::i32, root);
      for (int i = 0; i < count; ++i) expect(k, "broadcast", in[i], value(k, root, i), i);
    } else if (kind <= 3) {  // scatter
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < count; ++i) in[j * count + i] = r == root ? value(k, j, i) : -1;
      world.scatter(in.data(), out.data(), c, DType::i32, root);
      for (int i = 0; i < count; ++i) expect(k, "scatter", out[i], value(k, r, i), i);
    } else if (kind <= 5) {  // gather
      for (int i = 0; i < count; ++i) in[i] = value(k, r, i);
      std::fill(out.begin(), out.end(), -1);
      world.gather(in.data(), out.data(), c, DType::i32, root);
      if (r == root) {
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < count; ++i) expect(k, "gather", out[j * count + i], value(k, j, i), i);
      }
    } else if (kind <= 7) {  // reduce
      for (int i = 0; i < count; ++i) in[i] = value(k, r, i);
      world.reduce(in.data(), out.data(), c, DType::i32, ReduceOp::sum, root);
      if (r == root) {
        for (int i = 0; i < count; ++i) {
          std::int32_t sum = 0;
          for (int j = 0; j < n; ++j) sum += value(k, j, i);
          expect(k, "reduce", out[i], sum, i);
        }
      }
    } else {  // a lockstep call in between
      for (int i = 0; i < count; ++i) in[i] = value(k, r, i);
      world.allreduce(in.data(), out.data(), c, DType::i32, ReduceOp::max);
      for (int i = 0; i < count; ++i) {
        std::int32_t top = value(k, 0, i);
        for (int j = 1; j < n; ++j) top = std::max(top, value(k, j, i));
        expect(k, "allreduce", out[i], top, i);
      }
    }
  }
  // Senders run ahead of receivers that sleep: depth - 1 calls return at once. With the default
  // small size the depth is 64 slots up to 16 ranks, 32 up to 32, 16 beyond (comm_state.hpp
  // kCommSlotBudget); a shallower ring fails here. Another NODAL_SMALL_MAX_BYTES only promises 2.
  const bool default_small = std::getenv("NODAL_SMALL_MAX_BYTES") == nullptr;
  const int ahead_calls = !default_small ? 1 : n <= 16 ? 63 : n <= 32 ? 31 : 15;
  auto ahead = [&](bool sender, const std::function<void(int)>& call) {
    world.barrier();
    auto start = Clock::now();
    if (!sender) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    for (int k = 0; k < ahead_calls; ++k) call(k);
    double ms = ms_since(start);
    if (sender && ms > 250)
      fail(format("%d small rooted calls took %.0f ms while their receivers slept 600 ms", ahead_calls, ms));
    return ms;
  };
  std::int32_t x[2];
  double broadcast_ms = ahead(r == 0, [&](int k) {
    x[0] = r == 0 ? 1000 + k : -1;
    world.broadcast(x, 1, DType::i32, 0);
    expect(k, "broadcast ahead", x[0], 1000 + k, 0);
  });
  double gather_ms = ahead(r != 0, [&](int k) {
    x[0] = 2000 + k * n + r;
    world.gather(x, out.data(), 1, DType::i32, 0);
    for (int j = 0; r == 0 && j < n; ++j) expect(k, "gather ahead", out[j], 2000 + k * n + j, j);
  });
  checked_allreduce(world, 4321, 1000, "allreduce after the rooted calls");
  std::printf("rank %d rooted ok %ld calls; %d calls ahead: broadcast %.0f ms, gather %.0f ms\n", r, iters,
              ahead_calls, broadcast_ms, gather_ms);
  return 0;
}

// ---- Errors the caller causes. ----

class CaseRunner {
 public:
  CaseRunner(Communicator comm, int global) : comm_(std::move(comm)), global_(global) {}

  /// Runs `call`; every rank must get UsageError. Then a checked allreduce: the communicator works.
  template <class F>
  void expect_usage_error(const std::string& name, F&& call) {
    std::string outcome;
    try {
      call();
      outcome = "no error";
    } catch (const nodal::UsageError& e) {
      outcome = "UsageError";
      if (std::string(e.what()).empty())
        outcome = "UsageError without a message";
      else
        last_message_ = e.what();
    } catch (const std::exception& e) {
      outcome = std::string("another exception: ") + e.what();
    }
    if (outcome != "UsageError") fail(format("case %s: expected UsageError, got %s", name.c_str(), outcome.c_str()));
    std::printf("rank %d case %s: UsageError: %s\n", global_, name.c_str(), last_message_.c_str());
    std::fflush(stdout);
    checked_allreduce(comm_, cases_, 1 + static_cast<std::size_t>(cases_ % 5) * 997, "allreduce after case " + name);
    ++cases_;
  }
  /// For small rooted calls (broadcast, scatter, gather, reduce), whose senders post and return
  /// without checking: `call` or the next collective call (a small allreduce) throws UsageError on
  /// every rank; then a checked allreduce: the communicator works.
  template <class F>
  void expect_usage_error_by_next_call(const std::string& name, F&& call) {
    auto usage_error = [&](auto&& f) -> std::string {
      try {
        f();
        return "";
      } catch (const nodal::UsageError& e) {
        return e.what();
      } catch (const std::exception& e) {
        fail(format("case %s: expected UsageError, got another exception: %s", name.c_str(), e.what()));
      }
    };
    std::string at_call = usage_error(call);
    float x = 1.0f;
    std::string at_next = usage_error([&] { comm_.allreduce(&x, &x, 1, DType::f32); });
    if (at_call.empty() && at_next.empty()) {
      fail(format("case %s: no UsageError, neither from the call nor from the next one", name.c_str()));
    }
    std::printf("rank %d case %s: UsageError at the %s: %s\n", global_, name.c_str(),
                at_call.empty() ? "next call" : "call", (at_call.empty() ? at_next : at_call).c_str());
    std::fflush(stdout);
    checked_allreduce(comm_, cases_, 1 + static_cast<std::size_t>(cases_ % 5) * 997, "allreduce after case " + name);
    ++cases_;
  }
  int cases() const { return cases_; }

 private:
  Communicator comm_;
  int global_;
  int cases_ = 0;
  std::string last_message_;
};

int mismatch(const nodal::Context& ctx) {
  Communicator world = ctx.world();
  const int n = world.world_size(), r = world.rank();
  if (n < 2) fail("mismatch needs at least 2 ranks");
  const bool odd_one = r == n - 1;  // the rank that disagrees (rank 0 in the *_first cases)
  CaseRunner cases(world, ctx.rank());
  std::vector<std::byte> a(8 * 300001 * 2), b(8 * 300001 * 2);
  void* in = a.data();
  void* out = b.data();
  const std::size_t big = 300000;

  // Different counts, small and large, the odd rank last or first.
  cases.expect_usage_error("allreduce count 8 vs 9", [&] { world.allreduce(in, out, odd_one ? 9 : 8, DType::f32); });
  cases.expect_usage_error("allreduce count 8 vs 0", [&] { world.allreduce(in, out, odd_one ? 0 : 8, DType::f32); });
  cases.expect_usage_error("allreduce count large vs large+1 (rank 0 differs)",
                           [&] { world.allreduce(in, out, r == 0 ? big + 1 : big, DType::f32); });
  cases.expect_usage_error("allreduce in place count large vs 7",
                           [&] { world.allreduce(in, in, odd_one ? 7 : big, DType::i32); });
  cases.expect_usage_error("allreduce dtype f32 vs i32",
                           [&] { world.allreduce(in, out, 8, odd_one ? DType::i32 : DType::f32); });
  cases.expect_usage_error("allreduce dtype f32 vs f64",
                           [&] { world.allreduce(in, out, 8, odd_one ? DType::f64 : DType::f32); });
  cases.expect_usage_error("allreduce dtype large f16 vs bf16",
                           [&] { world.allreduce(in, out, big, odd_one ? DType::bf16 : DType::f16); });
  cases.expect_usage_error("allreduce op sum vs max",
                           [&] { world.allreduce(in, out, 8, DType::f32, odd_one ? ReduceOp::max : ReduceOp::sum); });
  cases.expect_usage_error("allreduce op large prod vs min (rank 0 differs)",
                           [&] { world.allreduce(in, out, big, DType::i64, r == 0 ? ReduceOp::min : ReduceOp::prod); });
  cases.expect_usage_error_by_next_call("reduce root 0 vs 1",
                           [&] { world.reduce(in, out, 8, DType::f32, ReduceOp::sum, odd_one ? 1 : 0); });
  cases.expect_usage_error_by_next_call("reduce op",
                           [&] { world.reduce(in, out, 8, DType::f32, odd_one ? ReduceOp::avg : ReduceOp::sum, 0); });
  cases.expect_usage_error("reduce count large",
                           [&] { world.reduce(in, out, odd_one ? big - 1 : big, DType::u8, ReduceOp::max, 0); });
  cases.expect_usage_error_by_next_call("broadcast root 0 vs 1", [&] { world.broadcast(in, 8, DType::i64, odd_one ? 1 : 0); });
  cases.expect_usage_error("broadcast count large",
                           [&] { world.broadcast(in, odd_one ? big + 2 : big, DType::i64, 0); });
  cases.expect_usage_error_by_next_call("broadcast dtype", [&] { world.broadcast(in, 8, odd_one ? DType::u8 : DType::i8, 0); });
  cases.expect_usage_error("allgather count", [&] { world.allgather(in, out, odd_one ? 3 : 4, DType::f32); });
  cases.expect_usage_error("allgather dtype", [&] { world.allgather(in, out, 4, odd_one ? DType::f64 : DType::i64); });
  cases.expect_usage_error("reduce_scatter count", [&] { world.reduce_scatter(in, out, odd_one ? 5 : 4, DType::f32); });
  cases.expect_usage_error("reduce_scatter op", [&] {
    world.reduce_scatter(in, out, 4, DType::f32, odd_one ? ReduceOp::prod : ReduceOp::sum);
  });
  cases.expect_usage_error_by_next_call("gather root", [&] { world.gather(in, out, 4, DType::f32, odd_one ? 1 : 0); });
  cases.expect_usage_error_by_next_call("gather count", [&] { world.gather(in, out, odd_one ? 5 : 4, DType::f32, 0); });
  cases.expect_usage_error_by_next_call("scatter root", [&] { world.scatter(in, out, 4, DType::f32, odd_one ? 1 : 0); });
  cases.expect_usage_error_by_next_call("scatter count", [&] { world.scatter(in, out, odd_one ? 5 : 4, DType::f32, 0); });
  cases.expect_usage_error("alltoall count", [&] { world.alltoall(in, out, odd_one ? 2 : 1, DType::f32); });
  {
    // Shared tensors (the in_place algorithm), numel differing.
    Tensor shared = Tensor::empty_shared({static_cast<std::int64_t>(odd_one ? big + 1 : big)}, DType::f32);
    std::memset(shared.data(), 0, shared.nbytes());
    cases.expect_usage_error("allreduce shared tensors numel", [&] { world.allreduce(shared); });
  }

  // Invalid arguments given alike on every rank: each rank throws before any data moves. Counts
  // whose bytes overflow size_t (count x element size; then x world_size), and a dtype cast from a
  // number outside the enum (no element size).
  const auto not_a_dtype = static_cast<DType>(42);
  const std::vector<std::size_t> ones(static_cast<std::size_t>(n), 1);
  for (auto [name, call] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"allreduce count too large", [&] { world.allreduce(in, out, SIZE_MAX / 2, DType::f32); }},
           {"allgather count too large", [&] { world.allgather(in, out, SIZE_MAX / 5, DType::f32); }},
           {"broadcast dtype not a DType", [&] { world.broadcast(in, 4, not_a_dtype, 0); }},
           {"alltoallv dtype not a DType", [&] { world.alltoallv(in, ones, out, ones, not_a_dtype); }},
           {"allreduce avg of bool", [&] { world.allreduce(in, out, 8, DType::bool_, ReduceOp::avg); }},
           {"reduce avg of bool", [&] { world.reduce(in, out, 8, DType::bool_, ReduceOp::avg, 0); }},
           {"reduce_scatter avg of bool", [&] { world.reduce_scatter(in, out, 8, DType::bool_, ReduceOp::avg); }},
           {"reduce root = world_size", [&] { world.reduce(in, out, 8, DType::f32, ReduceOp::sum, n); }},
           {"broadcast root -1", [&] { world.broadcast(in, 8, DType::f32, -1); }},
           {"gather root = world_size", [&] { world.gather(in, out, 8, DType::f32, n); }},
           {"scatter root -1", [&] { world.scatter(in, out, 8, DType::f32, -1); }},
       }) {
    cases.expect_usage_error(name, call);
  }
  {
    Tensor t = Tensor::empty({8}, DType::f32);
    Tensor strided(t.storage(), t.storage_offset(), {4}, {2}, DType::f32);  // every other element: not contiguous
    Tensor undefined;
    Tensor f64 = Tensor::empty({8}, DType::f64);
    Tensor nine = Tensor::empty({9}, DType::f32);
    Tensor gathered_wrong = Tensor::empty({8 * n + 1}, DType::f32);
    Tensor rs_out = Tensor::empty({8}, DType::f32);
    Tensor rs_in_wrong = Tensor::empty({8 * n - 1}, DType::f32);
    cases.expect_usage_error("tensor allreduce not contiguous", [&] { world.allreduce(strided); });
    cases.expect_usage_error("tensor allreduce undefined", [&] { world.allreduce(undefined); });
    cases.expect_usage_error("tensor broadcast undefined", [&] { world.broadcast(undefined, 0); });
    cases.expect_usage_error("tensor allreduce output dtype differs", [&] { world.allreduce(t, f64); });
    cases.expect_usage_error("tensor allreduce output numel differs", [&] { world.allreduce(t, nine); });
    cases.expect_usage_error("tensor allgather output not world_size x input",
                             [&] { world.allgather(t, gathered_wrong); });
    cases.expect_usage_error("tensor reduce_scatter input not world_size x output",
                             [&] { world.reduce_scatter(rs_in_wrong, rs_out); });
    cases.expect_usage_error("tensor reduce avg of bool", [&] {
      Tensor flags = Tensor::zeros({3}, DType::bool_);
      world.reduce(flags, ReduceOp::avg, 0);
    });
  }
  checked_allreduce(world, 12345, 1000003, "large allreduce after every case");
  std::printf("rank %d mismatch ok %d cases\n", ctx.rank(), cases.cases());
  return 0;
}

int mismatch_kind(const nodal::Context& ctx) {
  Communicator world = ctx.world();
  CaseRunner cases(world, ctx.rank());
  std::vector<float> in(64, 1.0f), out(64 * static_cast<std::size_t>(world.world_size()));
  cases.expect_usage_error("allreduce vs broadcast", [&] {
    if (world.rank() == 0)
      world.allreduce(in.data(), out.data(), 8, DType::f32);
    else
      world.broadcast(in.data(), 8, DType::f32, 0);
  });
  cases.expect_usage_error("allgather vs barrier", [&] {
    if (world.rank() == world.world_size() - 1)
      world.barrier();
    else
      world.allgather(in.data(), out.data(), 8, DType::f32);
  });
  std::printf("rank %d mismatch_kind ok %d cases\n", ctx.rank(), cases.cases());
  return 0;
}

// ---- Point to point. ----

struct Message {
  std::size_t count;
  DType dtype;
};

/// Message `m` from global rank `from` under seed: element k is input_value(seed ^ m, from, k).
template <DType D>
void fill_message(void* data, std::size_t count, std::uint64_t seed, int from) {
  auto* p = static_cast<T_of<D>*>(data);
  for (std::size_t k = 0; k < count; ++k) p[k] = input_value<D>(seed, from, k, ReduceOp::sum);
}

void send_checked(Communicator& comm, const Message& m, std::uint64_t seed, int to, bool tensor, bool shared,
                  int tag = 0) {
  Tensor t = alloc(m.count, m.dtype, shared);
  int me = comm.global_rank(comm.rank());
  with_dtype(m.dtype, [&]<DType D>() { fill_message<D>(t.data(), m.count, seed, me); });
  if (tensor)
    comm.send(t, to, tag);
  else
    comm.send(t.data(), m.count, m.dtype, to, tag);
}

void recv_checked(Communicator& comm, const Message& m, std::uint64_t seed, int from, bool tensor, bool shared,
                  const std::string& what, int tag = 0) {
  Tensor t = alloc(m.count, m.dtype, shared);
  if (t.nbytes()) std::memset(t.data(), kSentinel, t.nbytes());
  if (tensor)
    comm.recv(t, from, tag);
  else
    comm.recv(t.data(), m.count, m.dtype, from, tag);
  int sender = comm.global_rank(from);
  with_dtype(m.dtype, [&]<DType D>() {
    const auto* p = static_cast<const T_of<D>*>(t.data());
    for (std::size_t k = 0; k < m.count; ++k) {
      T_of<D> e = input_value<D>(seed, sender, k, ReduceOp::sum);
      if (std::memcmp(&e, &p[k], sizeof e) != 0) {
        fail(format("%s: %zu %s from rank %d: element %zu expected %s got %s", what.c_str(), m.count, name_of(m.dtype),
                    from, k, show<D>(e).c_str(), show<D>(p[k]).c_str()));
      }
    }
  });
}

int p2p(const nodal::Context& ctx) {
  Communicator world = ctx.world();
  const int n = world.world_size(), r = world.rank();
  if (n < 2) fail("p2p needs at least 2 ranks");
  int messages = 0;

  // 1. A long sequence 0 -> 1 of every dtype and assorted sizes, large ones included, with assorted
  // tags (the same on both sides): in order.
  const std::size_t counts[] = {0, 1, 7, 1000, 3, 4096, 1000003, 65, 2};
  const int tags[] = {0, 7, -1, 1 << 30};
  for (int m = 0; m < 60; ++m) {
    Message msg{counts[m % 9], kAllDtypes[(m + m / 9) % 9]};  // every size meets several dtypes
    bool tensor = m % 4 >= 2, shared = m % 3 == 0;
    std::uint64_t seed = 1000 + static_cast<std::uint64_t>(m);
    const int tag = tags[m % 4 == 3 ? (m / 4) % 4 : m % 4];
    if (r == 0) send_checked(world, msg, seed, 1, tensor, shared, tag);
    if (r == 1) recv_checked(world, msg, seed, 0, !tensor, m % 5 == 0, format("sequence message %d", m), tag);
    ++messages;
  }

  // 2. Every ordered pair in turn, a small and a larger message each.
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      std::uint64_t seed = 5000 + static_cast<std::uint64_t>(a * n + b);
      Message small{7, DType::f64}, larger{100000, DType::i8};
      if (r == a) {
        send_checked(world, small, seed, b, false, false);
        send_checked(world, larger, seed + 1, b, true, false);
      }
      if (r == b) {
        recv_checked(world, small, seed, a, false, false, format("pair %d->%d small", a, b));
        recv_checked(world, larger, seed + 1, a, false, true, format("pair %d->%d larger", a, b));
      }
      messages += 2;
    }
  }

  // 3. A ring, everyone at once: even ranks send first, odd ranks receive first.
  for (int round = 0; round < 5; ++round) {
    Message msg{round % 2 ? std::size_t{200003} : std::size_t{5}, DType::f32};
    std::uint64_t seed = 9000 + static_cast<std::uint64_t>(round);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      send_checked(world, msg, seed, next, round % 2 == 0, false);
      recv_checked(world, msg, seed, prev, false, false, format("ring round %d", round));
    } else {
      recv_checked(world, msg, seed, prev, true, false, format("ring round %d", round));
      send_checked(world, msg, seed, next, false, false);
    }
    ++messages;
  }

  // 4. A burst: 1000 small messages 0 -> 1 while rank 1 starts late; they arrive in order.
  if (r == 0) {
    for (std::int64_t i = 0; i < 1000; ++i) world.send(&i, 1, DType::i64, 1);
  } else if (r == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (std::int64_t i = 0; i < 1000; ++i) {
      std::int64_t got = -1;
      world.recv(&got, 1, DType::i64, 0);
      if (got != i)
        fail(format("burst: message %lld arrived as %lld", static_cast<long long>(i), static_cast<long long>(got)));
    }
  }
  messages += 1000;

  // 5. Mismatches: UsageError on both sides. The library then marks that direction of the pair broken
  // ("the pair's channel is unusable now"): later calls on it must throw UsageError at once, never
  // hang; the other direction (when not broken itself), other pairs and collectives keep working.
  // One case per direction: 0->1, 1->0, then 0->2, 2->0 when there are 3 ranks.
  struct MismatchCase {
    const char* name;
    Message sent, received;
    int sent_tag = 0, received_tag = 0;
  };
  // A tag differs: the recv does not wait for a later message with its tag (the sender of this one
  // waits in its rendezvous): a mismatch like the others.
  const MismatchCase mismatches[] = {{"send 8 recv 7", {8, DType::f32}, {7, DType::f32}},
                                     {"send tag 5 recv tag 6", {8, DType::f32}, {8, DType::f32}, 5, 6},
                                     // 50 KiB: above the agents' inline limit, one chunk, which
                                     // crosses nodes beside its header (p2p_relay.hpp)
                                     {"send f32 recv i32", {12800, DType::f32}, {12800, DType::i32}},
                                     {"send large recv large+1", {300000, DType::f64}, {300001, DType::f64}}};
  std::vector<std::pair<int, int>> directions = {{0, 1}, {1, 0}};
  if (n >= 3) directions.insert(directions.end(), {{0, 2}, {2, 0}});
  auto usage_error = [&](const std::string& what, auto&& call) {
    std::string outcome = "no error";
    try {
      call();
    } catch (const nodal::UsageError& e) {
      std::printf("rank %d p2p case %s: UsageError: %s\n", r, what.c_str(), e.what());
      return;
    } catch (const std::exception& e) {
      outcome = std::string("another exception: ") + e.what();
    }
    fail(format("p2p case %s: expected UsageError on rank %d, got %s", what.c_str(), r, outcome.c_str()));
  };
  for (std::size_t i = 0; i < directions.size(); ++i) {
    auto [from, to] = directions[i];
    const MismatchCase& mc = mismatches[i];
    const Message ok{8, DType::f32};
    if (r == from) {
      usage_error(mc.name, [&] { send_checked(world, mc.sent, 77, to, false, false, mc.sent_tag); });
      usage_error(std::string(mc.name) + ", later call", [&] { send_checked(world, ok, 78, to, false, false); });
    } else if (r == to) {
      usage_error(mc.name, [&] { recv_checked(world, mc.received, 77, from, false, false, mc.name, mc.received_tag); });
      usage_error(std::string(mc.name) + ", later call",
                  [&] { recv_checked(world, ok, 78, from, false, false, "later call"); });
    }
    bool reverse_broken = std::find(directions.begin(), directions.begin() + static_cast<std::ptrdiff_t>(i),
                                    std::make_pair(to, from)) != directions.begin() + static_cast<std::ptrdiff_t>(i);
    if (!reverse_broken) {
      if (r == to) send_checked(world, ok, 79, from, false, false);
      if (r == from) recv_checked(world, ok, 79, to, false, false, format("%d->%d after %s", to, from, mc.name));
      ++messages;
    }
    checked_allreduce(world, 300 + static_cast<std::int64_t>(i), 1 + i * 1000, format("allreduce after %s", mc.name));
  }
  if (n >= 3) {  // a pair no mismatch touched
    if (r == 1) send_checked(world, {1000, DType::i32}, 80, 2, false, false);
    if (r == 2) recv_checked(world, {1000, DType::i32}, 80, 1, false, false, "1->2 after the mismatches");
    ++messages;
  }

  // 6. Collectives still line up after all that.
  checked_allreduce(world, 4242, 1000, "allreduce after p2p");
  std::printf("rank %d p2p ok %d messages\n", r, messages);
  return 0;
}

// ---- A rank dies. ----

int kill_mode(const nodal::Context& ctx, const Options& o) {
  Communicator world = ctx.world();
  const int n = world.world_size(), r = world.rank();
  const std::string what = o.get("what", "allreduce");
  const int victim = static_cast<int>(o.get("victim", n - 1));
  const long delay_ms = o.get("delay_ms", 300);
  const auto count = static_cast<std::size_t>(o.get("count", 4 << 20));
  const bool sigkill = o.get("die", "kill") == "kill";
  if (r != victim) ::signal(SIGTERM, SIG_IGN);  // so that PeerFailure, not nodalrun's SIGTERM, ends survivors
  nodal::Array<std::int64_t> died_at = nodal::Array<std::int64_t>::open("coll_kill_died_at", 1);
  Communicator group = what == "split" ? world.split(r % 2, r) : world;
  world.barrier();

  std::thread killer;
  if (r == victim) {
    killer = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::atomic_ref<std::int64_t>(died_at[0]).store(now_ns(), std::memory_order_release);
      if (sigkill) ::raise(SIGKILL);
      std::_Exit(3);
    });
  }
  bool victim_waits = r == victim && (what == "barrier" || what == "recv");  // survivors' calls stay pending

  Tensor in, out;
  if (what == "allreduce" || what == "split" || what == "broadcast" || what == "reduce") {
    in = alloc(count, DType::f32, false), out = alloc(count, DType::f32, false);
  } else if (what == "gather") {
    in = alloc(count, DType::f32, false), out = alloc(count * static_cast<std::size_t>(n), DType::f32, false);
  } else if (what == "allreduce_shared") {
    in = alloc(count, DType::f32, true), out = alloc(count, DType::f32, true);
  }
  if (in.defined()) std::fill_n(in.data_ptr<float>(), count, 1.0f);
  auto deadline = Clock::now() + std::chrono::seconds(30);
  long calls = 0;
  auto one_call = [&] {
    float x = 1.0f;
    if (what == "allreduce" || what == "allreduce_shared")
      group.allreduce(in, out);
    else if (what == "split")
      group.allreduce(in, out, ReduceOp::max);
    else if (what == "broadcast")
      group.broadcast(in, victim);
    else if (what == "reduce")
      group.reduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, 0);
    else if (what == "gather")
      group.gather(in.data(), out.data(), count, DType::f32, 0);
    else if (what == "small")
      group.allreduce(&x, &x, 1, DType::f32);
    else if (what == "barrier")
      group.barrier();
    else if (what == "recv")
      group.recv(in.defined() ? in.data() : &x, 1, DType::f32, victim);
    else
      fail("unknown kill kind " + what);
  };
  try {
    if (victim_waits) std::this_thread::sleep_for(std::chrono::seconds(60));
    while (Clock::now() < deadline) {
      one_call();
      if (++calls == 1) std::printf("rank %d %s algorithm %s\n", r, what.c_str(), group.last_algorithm().c_str());
    }
    fail(format("%s: no PeerFailure within 30 s (%ld calls)", what.c_str(), calls));
  } catch (const nodal::PeerFailure& e) {
    std::int64_t died = std::atomic_ref<std::int64_t>(died_at[0]).load(std::memory_order_acquire);
    double ms = died ? static_cast<double>(now_ns() - died) / 1e6 : -1.0;
    std::printf("rank %d PeerFailure after %.1f ms in %s call %ld: %s\n", r, ms, what.c_str(), calls, e.what());
    std::fflush(stdout);
  }
  // Every later call throws PeerFailure too, at once.
  for (const char* later : {"allreduce", "barrier", "broadcast"}) {
    auto start = Clock::now();
    try {
      float x = 1.0f;
      if (later == std::string("allreduce"))
        world.allreduce(&x, &x, 1, DType::f32);
      else if (later == std::string("barrier"))
        world.barrier();
      else
        world.broadcast(&x, 1, DType::f32, 0);
      fail(format("later %s returned normally after PeerFailure", later));
    } catch (const nodal::PeerFailure&) {
      std::printf("rank %d later %s PeerFailure after %.1f ms\n", r, later, ms_since(start));
    }
  }
  std::fflush(stdout);
  if (killer.joinable()) killer.join();
  return 0;
}

// ---- A rank leaves a call part-way. ----

/// Makes this process's process_vm_readv and process_vm_writev fail with EPERM from now on, on
/// every thread: what a container's seccomp profile (or a ptrace policy changed under a running
/// job) does to the cma paths. False where seccomp filters are not allowed.
bool deny_cma() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  return ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) == 0;
}

int part_way(const nodal::Context& ctx, const Options& o) {
  Communicator world = ctx.world();
  const int n = world.world_size(), r = world.rank();
  const std::string what = o.get("what", "gather");
  bool denier = false;  // whether this rank is one of the deniers (a comma-separated list)
  std::stringstream deniers(o.get("denier", std::to_string(n - 1)));
  for (std::string item; std::getline(deniers, item, ',');) denier = denier || std::stoi(item) == r;
  const auto count = static_cast<std::size_t>(o.get("count", 20011));
  const bool in_place = o.get("in_place", 0) == 1;        // allreduce
  const bool nonblocking = o.get("nonblocking", 0) == 1;  // allreduce: iallreduce(...).wait()
  const std::size_t out_count = what == "gather" ? count * static_cast<std::size_t>(n) : in_place ? 0 : count;
  Tensor in_tensor = alloc(count, DType::f32, false), out_tensor = alloc(out_count, DType::f32, false);
  float* in = in_tensor.data_ptr<float>();
  float* out = out_tensor.data_ptr<float>();
  float* result = in_place ? in : out;
  const std::size_t result_count = in_place ? count : out_count;
  long calls = 0;
  // Call k of rank j contributes k * 10 + j; every call that returns is checked.
  auto one_call = [&] {
    std::fill_n(in, count, static_cast<float>(calls * 10 + r));
    float expected = static_cast<float>(calls * 10 * n + n * (n - 1) / 2);  // reduce, allreduce
    bool check = r == 0;
    if (what == "gather") {
      world.gather(in, out, count, DType::f32, 0);
    } else if (what == "reduce") {
      world.reduce(in, out, count, DType::f32, ReduceOp::sum, 0);
    } else if (what == "allreduce") {
      if (nonblocking && in_place) {
        world.iallreduce(in_tensor).wait();
      } else if (nonblocking) {
        world.iallreduce(in_tensor, out_tensor).wait();
      } else {
        world.allreduce(in, result, count, DType::f32);
      }
      check = true;
    } else if (what == "broadcast") {
      world.broadcast(in, count, DType::f32, 0);
      std::copy_n(in, count, out);
      expected = static_cast<float>(calls * 10);
      check = true;
    } else {
      fail("unknown part_way kind " + what);
    }
    for (std::size_t i = 0; check && i < result_count; ++i) {
      const float want = what == "gather" ? static_cast<float>(calls * 10 + static_cast<long>(i / count)) : expected;
      if (result[i] != want) fail(format("part_way %s call %ld: element %zu is %g, expected %g", what.c_str(), calls,
                                         i, static_cast<double>(result[i]), static_cast<double>(want)));
    }
  };
  one_call();
  std::printf("rank %d part_way %s algorithm %s\n", r, what.c_str(), world.last_algorithm().c_str());
  int denied = !denier || deny_cma() ? 1 : 0;
  world.allreduce(&denied, &denied, 1, DType::i32, ReduceOp::min);
  if (denied == 0) {
    std::printf("rank %d no seccomp\n", r);
    return 0;
  }
  auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string error;
  try {
    while (Clock::now() < deadline) {
      ++calls;
      one_call();
    }
    fail(format("part_way %s: no error within 20 s (%ld calls)", what.c_str(), calls));
  } catch (const nodal::PeerFailure& e) {
    error = format("PeerFailure in call %ld: %s", calls, e.what());
  } catch (const nodal::Error& e) {
    error = format("Error in call %ld: %s", calls, e.what());
  }
  // The buffers are the caller's again: no peer may still write them (Call::leave_part_way), nor
  // read them (it would return this as its result: checked above).
  std::fill_n(in, count, -7.0f);
  std::fill_n(out, out_count, -7.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (const auto& [buffer, size] : {std::pair{in, count}, std::pair{out, out_count}}) {
    for (std::size_t i = 0; i < size; ++i) {
      if (buffer[i] != -7.0f) fail(format("part_way %s: element %zu of a buffer was written after the call threw",
                                          what.c_str(), i));
    }
  }
  std::printf("rank %d %s\n", r, error.c_str());
  auto start = Clock::now();
  try {
    float x = 1.0f;
    world.allreduce(&x, &x, 1, DType::f32);
    fail("part_way: a later allreduce returned normally");
  } catch (const nodal::PeerFailure& e) {
    std::printf("rank %d later PeerFailure after %.1f ms: %s\n", r, ms_since(start), e.what());
  }
  return 0;
}

/// One rank in place, the others not: the algorithm table must pick the same path for all.
int mixed_place(const nodal::Context& ctx, bool arena) {
  nodal::Communicator world = ctx.world();
  const int n = world.world_size();
  for (std::size_t mib : {1, 20, 48}) {
    const std::size_t count = mib << 18;  // f32 elements
    std::vector<float> private_in(count), out(count);
    Tensor shared = arena && ctx.rank() == 0 ? alloc(count, DType::f32, true) : Tensor();
    float* in = shared.defined() ? shared.data_ptr<float>() : private_in.data();
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(ctx.rank() + static_cast<int>(i % 7));
    float* result = ctx.rank() == 0 || arena ? in : out.data();
    world.allreduce(in, result, count, nodal::DType::f32, nodal::ReduceOp::sum);
    for (std::size_t i = 0; i < count; ++i) {
      const float expected = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 7));
      if (result[i] != expected) {
        std::printf("rank %d: mixed_place %zu MiB: element %zu is %g, expected %g\n", ctx.rank(), mib, i,
                    static_cast<double>(result[i]), static_cast<double>(expected));
        return 1;
      }
    }
    std::printf("rank %d: mixed_place %zu MiB ok (%s)\n", ctx.rank(), mib, world.last_algorithm().c_str());
  }
  return 0;
}

/// gather of private f32 inputs (78 KiB per rank: cma's range) into a root's output that is
/// private or in the arena, every rank the root in turn: the peers write their blocks into it
/// (shm/cma.cpp run_cma_gather: process_vm_writev, or a copy into the arena), and not one element
/// past it (neither write is seen by ASan). Then a gather whose count differs on rank 1: every
/// rank gets UsageError and the root's output stays untouched; the next gather works.
int gather_places(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const int n = world.world_size();
  const std::size_t count = 20011;
  const std::size_t total = count * static_cast<std::size_t>(n);
  constexpr std::size_t kGuard = 64;  // elements after the output that must stay -1
  auto gather_into = [&](int root, bool arena, std::size_t my_count, bool mismatch) -> int {
    const bool is_root = ctx.rank() == root;
    const char* what = mismatch ? "mismatch" : "match";
    std::vector<float> in(my_count), out(is_root ? total + kGuard : 0, -1.0f);
    Tensor shared = is_root && arena ? alloc(total + kGuard, DType::f32, true) : Tensor();
    float* result = shared.defined() ? shared.data_ptr<float>() : out.data();
    if (shared.defined()) std::fill(result, result + total + kGuard, -1.0f);
    for (std::size_t i = 0; i < my_count; ++i) in[i] = static_cast<float>(ctx.rank() * 1000 + static_cast<int>(i % 997));
    bool refused = false;
    try {
      world.gather(in.data(), result, my_count, DType::f32, root);
    } catch (const nodal::UsageError&) {
      refused = true;
    }
    if (refused != mismatch) {
      std::printf("rank %d: gather_places root %d %s: %s\n", ctx.rank(), root, what,
                  refused ? "refused a matching call" : "no UsageError for a mismatched count");
      return 1;
    }
    for (std::size_t i = 0; is_root && i < total + kGuard; ++i) {
      const float expected = mismatch || i >= total
                                 ? -1.0f
                                 : static_cast<float>(static_cast<int>(i / count) * 1000 + static_cast<int>(i % count % 997));
      if (result[i] != expected) {
        std::printf("rank %d: gather_places root %d %s %s: element %zu is %g, expected %g\n", ctx.rank(), root,
                    arena ? "arena" : "private", what, i, static_cast<double>(result[i]),
                    static_cast<double>(expected));
        return 1;
      }
    }
    std::printf("rank %d: gather_places root %d %s %s ok (%s)\n", ctx.rank(), root, arena ? "arena" : "private", what,
                mismatch ? "refused" : world.last_algorithm().c_str());
    return 0;
  };
  for (int root = 0; root < n; ++root) {
    for (const bool arena : {false, true}) {
      if (gather_into(root, arena, count, false) != 0) return 1;
    }
  }
  if (gather_into(0, false, ctx.rank() == 1 ? 2 * count : count, true) != 0) return 1;
  return gather_into(0, false, count, false);
}

/// reduce_places: every root in turn, the inputs private, the root's output private or in the
/// arena; sums of small integers are exact, so every element is checked against its sum, and not
/// one after the message may change.
int reduce_places(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const int n = world.world_size(), me = world.rank();
  constexpr std::size_t kGuard = 64;
  for (const std::size_t count : {std::size_t{20011}, std::size_t{100003}}) {
    std::vector<float> in(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(me * 1000 + static_cast<int>(i % 997));
    for (int root = 0; root < n; ++root) {
      for (const bool arena : {false, true}) {
        const bool is_root = me == root;
        std::vector<float> own(is_root ? count + kGuard : 0, -1.0f);
        Tensor shared = is_root && arena ? alloc(count + kGuard, DType::f32, true) : Tensor();
        float* out = shared.defined() ? shared.data_ptr<float>() : own.data();
        if (shared.defined()) std::fill(out, out + count + kGuard, -1.0f);
        world.reduce(in.data(), is_root ? out : nullptr, count, DType::f32, nodal::ReduceOp::sum, root);
        for (std::size_t i = 0; is_root && i < count + kGuard; ++i) {
          const float expected =
              i >= count ? -1.0f : static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i % 997));
          if (out[i] != expected) {
            std::printf("rank %d: reduce_places root %d %s %zu: element %zu is %g, expected %g\n", me, root,
                        arena ? "arena" : "private", count, i, static_cast<double>(out[i]),
                        static_cast<double>(expected));
            return 1;
          }
        }
        std::printf("rank %d: reduce_places root %d %s %zu ok (%s)\n", me, root, arena ? "arena" : "private", count,
                    world.last_algorithm().c_str());
      }
    }
  }
  return 0;
}

/// broadcast_places: every root in turn, from a private buffer; the receivers' buffers private
/// ("private"), in the arena on odd ranks ("arena"), or private on a communicator where the rank
/// after the root forbids cma ("no_cma"). Where the root writes a share of the message into the
/// receivers (shm/cma.cpp run_cma_broadcast) it must copy into an arena buffer and leave a rank
/// that forbids cma to read all of it; not one element after the message may change.
int broadcast_places(const nodal::Context& ctx) {
  nodal::Communicator world = ctx.world();
  const int n = world.world_size(), me = world.rank();
  constexpr std::size_t kGuard = 64;
  auto broadcast_into = [&](nodal::Communicator& comm, int root, const char* layout, bool arena, std::size_t count) {
    std::vector<float> own(count + kGuard);
    Tensor shared = arena ? alloc(count + kGuard, DType::f32, true) : Tensor();
    float* buffer = shared.defined() ? shared.data_ptr<float>() : own.data();
    auto value = [&](std::size_t i) { return static_cast<float>(root * 1000 + static_cast<int>(i % 997)); };
    for (std::size_t i = 0; i < count + kGuard; ++i) buffer[i] = i >= count ? -1.0f : me == root ? value(i) : -3.0f;
    comm.broadcast(buffer, count, DType::f32, root);
    for (std::size_t i = 0; i < count + kGuard; ++i) {
      const float expected = i >= count ? -1.0f : value(i);
      if (buffer[i] != expected) {
        std::printf("rank %d: broadcast_places root %d %s %zu: element %zu is %g, expected %g\n", me, root, layout,
                    count, i, static_cast<double>(buffer[i]), static_cast<double>(expected));
        return 1;
      }
    }
    std::printf("rank %d: broadcast_places root %d %s %zu ok (%s)\n", me, root, layout, count,
                comm.last_algorithm().c_str());
    return 0;
  };
  for (const std::size_t count : {std::size_t{20011}, std::size_t{1000003}}) {
    for (int root = 0; root < n; ++root) {
      if (broadcast_into(world, root, "private", false, count) != 0) return 1;
      if (broadcast_into(world, root, "arena", me != root && me % 2 == 1, count) != 0) return 1;
      // cma_allowed() is asked when a communicator opens: the rank after the root forbids it for
      // the one split off now.
      const bool forbids = me == (root + 1) % n;
      if (forbids) ::setenv("NODAL_CMA", "0", 1);
      nodal::Communicator split = world.split(0, me);
      if (forbids) ::setenv("NODAL_CMA", "1", 1);
      if (broadcast_into(split, root, "no_cma", false, count) != 0) return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  nodal::Context ctx = nodal::init();
  g_rank = ctx.rank();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line out at once, even if an exception ends the rank
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coll_program: %s\n", e.what());
    return 64;
  }
  // staging_by_rank=M0:M1:...: rank r stages with NODAL_STAGING_STORES=Mr (read when its first
  // communicator opens, after this), so that one call mixes the stores its readers ask for.
  if (const std::string by_rank = options.get("staging_by_rank", std::string()); !by_rank.empty()) {
    std::vector<std::string> modes;
    for (std::size_t at = 0; at <= by_rank.size();) {
      const std::size_t end = std::min(by_rank.find(':', at), by_rank.size());
      modes.push_back(by_rank.substr(at, end - at));
      if (modes.back().empty()) {
        std::fprintf(stderr, "coll_program: staging_by_rank='%s' has an empty entry\n", by_rank.c_str());
        return 64;
      }
      at = end + 1;
    }
    ::setenv("NODAL_STAGING_STORES", modes[static_cast<std::size_t>(ctx.rank()) % modes.size()].c_str(), 1);
  }
  int rc = 64;
  if (mode == "matrix")
    rc = matrix(ctx, options);
  else if (mode == "split")
    rc = split_mode(ctx, options);
  else if (mode == "stress")
    rc = stress(ctx, options);
  else if (mode == "rooted")
    rc = rooted(ctx, options);
  else if (mode == "mismatch")
    rc = mismatch(ctx);
  else if (mode == "mismatch_kind")
    rc = mismatch_kind(ctx);
  else if (mode == "p2p")
    rc = p2p(ctx);
  else if (mode == "mixed_place")
    rc = mixed_place(ctx, options.get("arena", 0) == 1);
  else if (mode == "gather_places")
    rc = gather_places(ctx);
  else if (mode == "reduce_places")
    rc = reduce_places(ctx);
  else if (mode == "broadcast_places")
    rc = broadcast_places(ctx);
  else if (mode == "kill")
    rc = kill_mode(ctx, options);
  else if (mode == "part_way")
    rc = part_way(ctx, options);
  else
    std::fprintf(stderr, "coll_program: unknown mode '%s'\n", mode.c_str());
  std::fflush(stdout);
  return rc;
}
