// nodal::Tensor and its storage: layouts, views, copies, the shared arena (within a process and
// across a fork), mapped files and DLPack. References are computed here by plain index
// arithmetic, never by the code under test.
#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/cuda.hpp>
#include <nodal/tensor.hpp>
#include <nodal/detail/storage.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <system_error>
#include <vector>

#ifdef NODAL_HAVE_DLPACK
#include <dlpack/dlpack.h>
#endif

#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;
using nodal::Arena;
using nodal::Device;
using nodal::DType;
using nodal::Tensor;
using nodal::UsageError;
using nodal::detail::ArenaStorageHeader;
using nodal::detail::Storage;
using Shape = std::vector<std::int64_t>;

/// The job arena this process makes on first use is this size (checked by JobArena.*).
constexpr std::size_t kJobArenaBytes = std::size_t{256} << 20;
const bool kJobArenaSizeSet = [] {
  ::setenv("NODAL_SHM_SIZE", "256M", 1);
  return true;
}();

/// Fills a contiguous i32 tensor with 0, 1, 2, ...
void iota(const Tensor& t) {
  auto* p = t.data_ptr<std::int32_t>();
  std::iota(p, p + t.numel(), 0);
}

/// A contiguous f64 tensor holding 0, 1, 2, ... (exact in a double).
Tensor arange_f64(Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::f64);
  auto* p = t.data_ptr<double>();
  std::iota(p, p + t.numel(), 0.0);
  return t;
}

/// What the forked child writes: a scrambled but reproducible value per index.
std::int32_t pattern(std::int32_t i) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(i) * 2654435761u % 1000003) - 500000;
}

int open_descriptors() {
  return static_cast<int>(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{}));
}

/// A directory removed when the test ends.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string name = (fs::temp_directory_path() / "nodal-tensor-test-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) throw std::system_error(errno, std::generic_category(), "mkdtemp");
    path = name;
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(DTypeTest, SizesAndNamesOfAllDtypes) {
  struct Expected {
    DType dtype;
    std::size_t size;
    const char* name;
  };
  const Expected all[] = {{DType::bool_, 1, "bool"}, {DType::u8, 1, "u8"},   {DType::i8, 1, "i8"},
                          {DType::i32, 4, "i32"},    {DType::i64, 8, "i64"}, {DType::f16, 2, "f16"},
                          {DType::bf16, 2, "bf16"},  {DType::f32, 4, "f32"}, {DType::f64, 8, "f64"}};
  for (const Expected& e : all) {
    EXPECT_EQ(nodal::element_size(e.dtype), e.size) << e.name;
    EXPECT_EQ(nodal::dtype_name(e.dtype), e.name);
  }
}

TEST(TensorTest, EmptyHasShapeStridesAndAlignedPrivateStorage) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::f32);
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.device(), Device{});
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  EXPECT_FALSE(t.is_shared());
  EXPECT_FALSE(t.in_arena());

  Tensor scalar = Tensor::empty({}, DType::i64);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.strides().empty());

  Tensor none = Tensor::empty({3, 0, 5}, DType::u8);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.nbytes(), 0u);
  EXPECT_TRUE(none.is_contiguous());

  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_EQ(undefined.numel(), 0);
}

TEST(TensorTest, ZerosAreZero) {
  Tensor t = Tensor::zeros({7, 9}, DType::i64);
  EXPECT_EQ(t.strides(), (Shape{9, 1}));
  const auto* bytes = static_cast<const unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(bytes[i], 0) << i;
}

TEST(TensorTest, BadShapesAndDevicesAreUsageErrors) {
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32), UsageError);
  EXPECT_THROW(Tensor::zeros({-3}, DType::u8), UsageError);
  EXPECT_THROW(Tensor::empty(Shape(Tensor::kMaxDims + 1, 1), DType::f32), UsageError);
  EXPECT_NO_THROW(Tensor::empty(Shape(Tensor::kMaxDims, 1), DType::f32));
  EXPECT_THROW(Tensor::empty({std::int64_t{1} << 62, 4}, DType::f64), UsageError);  // bytes overflow
  EXPECT_THROW(Tensor::empty({4}, DType::f32, Device::cuda(-1)), UsageError);
  EXPECT_THROW(Tensor::empty_shared({-1}, DType::f32), UsageError);

  Tensor t = Tensor::empty({4, 6}, DType::f32);
  EXPECT_THROW(t.reshape({5, 5}), UsageError);
  EXPECT_THROW(t.reshape({-4, -6}), UsageError);
  EXPECT_THROW(t.slice(3, 5), UsageError);
  EXPECT_THROW(t.slice(2, 1), UsageError);
  EXPECT_THROW(Tensor::empty({}, DType::f32).slice(0, 1), UsageError);
  EXPECT_THROW(t.data_ptr<double>(), UsageError);
  EXPECT_THROW(t.data_ptr<std::int16_t>(), UsageError);
  EXPECT_NO_THROW(t.data_ptr<float>());

  // The storage constructor refuses views that reach outside their storage.
  auto storage = Storage::heap(96);
  EXPECT_THROW(Tensor(storage, 0, {4, 7}, {7, 1}, DType::f32), UsageError);
  EXPECT_THROW(Tensor(storage, 4, {24}, {1}, DType::f32), UsageError);
  EXPECT_THROW(Tensor(storage, 0, {4}, {-1}, DType::f32), UsageError);
  EXPECT_THROW(Tensor(storage, 0, {4, 6}, {1}, DType::f32), UsageError);
  EXPECT_THROW(Tensor(storage, 0, {4}, {1}, DType::f32, Device{Device::Kind::cuda, 0}), UsageError);  // host memory
  EXPECT_THROW(Tensor(nullptr, 0, {1}, {1}, DType::f32), UsageError);
  EXPECT_NO_THROW(Tensor(storage, 92, {4}, {-1}, DType::f32));
}

// Where no GPU can be used (a build without CUDA, no driver, no GPU), every way to make a cuda
// tensor is a CudaError that says why, and nothing else changes.
TEST(TensorTest, CudaTensorsWithoutAGpuSayWhy) {
  if (nodal::cuda::available()) GTEST_SKIP() << "a GPU is available here: tests/gpu cover cuda tensors";
  const std::string reason = nodal::cuda::unavailable_reason();
  ASSERT_FALSE(reason.empty());
  auto expect_reason = [&](auto&& make) {
    try {
      make();
      ADD_FAILURE() << "no CudaError";
    } catch (const nodal::CudaError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  expect_reason([] { Tensor::empty({4}, DType::f32, Device::cuda(0)); });
  expect_reason([] { Tensor::zeros({4}, DType::f32, Device::cuda(1)); });
  expect_reason([] { Tensor::empty({4}, DType::f32).to(Device::cuda(0)); });
  int fake = 0;
  expect_reason([&] { Tensor::from_cuda(&fake, {1}, DType::i32, 0); });
  EXPECT_EQ(nodal::cuda::device_count(), 0);
  EXPECT_THROW(nodal::cuda::synchronize(), nodal::CudaError);
  EXPECT_EQ(device_name(Device::cuda(3)), "cuda:3");
  EXPECT_EQ(device_name(Device{}), "cpu");
}

TEST(TensorTest, SliceAndReshapeShareStorage) {
  Tensor t = Tensor::empty({4, 6}, DType::i32);
  iota(t);
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(rows.storage(), t.storage());
  EXPECT_EQ(rows.storage_offset(), 6 * 4);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.data_ptr<std::int32_t>()[0], 6);

  rows.data_ptr<std::int32_t>()[7] = -7;  // row 1 of the slice, column 1: row 2, column 1 of t
  EXPECT_EQ(t.data_ptr<std::int32_t>()[2 * 6 + 1], -7);

  Tensor flat = t.reshape({24});
  EXPECT_EQ(flat.storage(), t.storage());
  EXPECT_EQ(flat.strides(), (Shape{1}));
  flat.data_ptr<std::int32_t>()[23] = 1234;
  EXPECT_EQ(t.data_ptr<std::int32_t>()[3 * 6 + 5], 1234);

  Tensor cube = rows.reshape({3, 2, 2});
  EXPECT_EQ(cube.strides(), (Shape{4, 2, 1}));
  cube.data_ptr<std::int32_t>()[2 * 4 + 1 * 2 + 1] = -11;  // element 11 of rows = t[2][5]
  EXPECT_EQ(t.data_ptr<std::int32_t>()[2 * 6 + 5], -11);

  Tensor none = t.slice(4, 4);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.shape(), (Shape{0, 6}));
}

TEST(TensorTest, CloneOfTransposedViewMatchesReference) {
  Tensor base = arange_f64({4, 5, 6});  // base[i][j][k] = 30 i + 6 j + k
  // Full transpose: view[k][j][i] = base[i][j][k].
  Tensor view(base.storage(), 0, {6, 5, 4}, {1, 6, 30}, DType::f64);
  EXPECT_FALSE(view.is_contiguous());
  Tensor copy = view.clone();
  ASSERT_TRUE(copy.is_contiguous());
  EXPECT_NE(copy.storage(), base.storage());
  const double* c = copy.data_ptr<double>();
  for (int k = 0; k < 6; ++k) {
    for (int j = 0; j < 5; ++j) {
      for (int i = 0; i < 4; ++i) ASSERT_EQ(c[k * 20 + j * 4 + i], 30.0 * i + 6.0 * j + k) << k << j << i;
    }
  }
  EXPECT_TRUE(copy.equal(view));
  EXPECT_FALSE(copy.equal(base));  // same bytes, another shape

  Tensor same = view.contiguous();
  EXPECT_TRUE(same.equal(copy));
  EXPECT_NE(same.storage(), base.storage());
  EXPECT_EQ(base.contiguous().storage(), base.storage());  // contiguous already: no copy
}

TEST(TensorTest, CloneOfSteppedAndReversedViewsMatchesReference) {
  Tensor base = arange_f64({100});
  // Every third element of rows of ten, from element 12: view[r][c] = base[12 + 10 r + 3 c].
  Tensor stepped(base.storage(), 12 * 8, {5, 3}, {10, 3}, DType::f64);
  Tensor copy = stepped.clone();
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 3; ++c) ASSERT_EQ(copy.data_ptr<double>()[r * 3 + c], 12.0 + 10 * r + 3 * c);
  }
  // Negative strides, starting at the last element: reversed[i][j] = base[99 - 10 i - j].
  Tensor reversed(base.storage(), 99 * 8, {10, 10}, {-10, -1}, DType::f64);
  Tensor back = reversed.clone();
  for (int i = 0; i < 10; ++i) {
    for (int j = 0; j < 10; ++j) ASSERT_EQ(back.data_ptr<double>()[i * 10 + j], 99.0 - 10 * i - j);
  }
  // A slice of a transposed view (stride 1 in dimension 0, not contiguous).
  Tensor transposed(base.storage(), 0, {10, 10}, {1, 10}, DType::f64);
  Tensor part = transposed.slice(3, 5).clone();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 10; ++j) ASSERT_EQ(part.data_ptr<double>()[i * 10 + j], 3.0 + i + 10 * j);
  }
}

TEST(TensorTest, EqualIsBitExact) {
  Tensor a = arange_f64({3, 3});
  Tensor b = a.clone();
  EXPECT_TRUE(a.equal(b));
  b.data_ptr<double>()[8] = -0.0;
  a.data_ptr<double>()[8] = 0.0;
  EXPECT_FALSE(a.equal(b));  // 0.0 == -0.0 as numbers, not as bits
  EXPECT_FALSE(a.equal(a.reshape({9})));
  EXPECT_FALSE(a.equal(Tensor()));
  EXPECT_TRUE(Tensor().equal(Tensor()));
  Tensor ints = Tensor::zeros({3, 3}, DType::i64);
  EXPECT_FALSE(ints.equal(Tensor::zeros({3, 3}, DType::f64)));
}

TEST(ShareMemoryTest, MovesPrivateStorageIntoTheArena) {
  Tensor t = Tensor::empty({1000}, DType::i32);
  iota(t);
  Tensor alias = t;               // another object holding the same storage
  Tensor rows = t.slice(10, 20);  // a view of it
  const void* before = t.data();
  ASSERT_FALSE(t.in_arena());

  EXPECT_EQ(&t.share_memory(), &t);
  EXPECT_TRUE(t.in_arena());
  EXPECT_TRUE(t.is_shared());
  EXPECT_TRUE(alias.in_arena());
  EXPECT_TRUE(rows.in_arena());
  EXPECT_NE(t.data(), before);
  EXPECT_TRUE(nodal::detail::job_arena().contains(t.data()));
  EXPECT_EQ(alias.data(), t.data());
  EXPECT_EQ(rows.data(), t.data_ptr<std::int32_t>() + 10);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(t.data_ptr<std::int32_t>()[i], i);

  const void* shared = t.data();
  t.share_memory();  // already there: nothing moves
  EXPECT_EQ(t.data(), shared);
}

TEST(ShareMemoryTest, EmptySharedAllocatesInTheArena) {
  Tensor t = Tensor::empty_shared({3, 7}, DType::i64);
  EXPECT_TRUE(t.in_arena());
  EXPECT_EQ(t.strides(), (Shape{7, 1}));
  const Arena& arena = nodal::detail::job_arena();
  ASSERT_TRUE(arena.contains(t.data()));
  EXPECT_EQ(arena.offset_of(t.data()), t.storage()->arena_offset() + nodal::detail::kArenaStorageDataOffset);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  for (int i = 0; i < 21; ++i) t.data_ptr<std::int64_t>()[i] = i * i;
  EXPECT_EQ(t.data_ptr<std::int64_t>()[20], 400);
}

TEST(ShareMemoryTest, ArenaBlockIsFreedWithItsLastReference) {
  auto arena = Arena::create(64 << 20);
  const std::size_t free_at_start = arena->free_bytes();
  constexpr std::size_t kBytes = 1 << 16;

  auto storage = Storage::arena(*arena, kBytes);
  const std::uint64_t offset = storage->arena_offset();
  const auto* header = static_cast<const ArenaStorageHeader*>(arena->at(offset));
  EXPECT_EQ(header->refs.load(), 1);
  EXPECT_EQ(header->bytes, kBytes);
  EXPECT_EQ(storage->bytes(), kBytes);
  EXPECT_LE(arena->free_bytes(), free_at_start - kBytes);
  std::memset(storage->data(), 0x5a, kBytes);

  storage->retain_for_handle();  // as a queue's put() does before the handle leaves
  EXPECT_EQ(header->refs.load(), 2);
  storage.reset();
  EXPECT_EQ(header->refs.load(), 1);
  const std::size_t free_while_queued = arena->free_bytes();
  EXPECT_LE(free_while_queued, free_at_start - kBytes);

  auto adopted = Storage::adopt_arena(*arena, offset);  // as get() does: takes that reference
  EXPECT_EQ(header->refs.load(), 1);
  EXPECT_EQ(adopted->kind(), Storage::Kind::arena);
  EXPECT_EQ(adopted->bytes(), kBytes);
  EXPECT_EQ(static_cast<unsigned char>(adopted->data()[kBytes - 1]), 0x5a);
  EXPECT_EQ(arena->free_bytes(), free_while_queued);

  Tensor tensor(adopted, 0, {static_cast<std::int64_t>(kBytes)}, {1}, DType::u8);
  adopted.reset();
  EXPECT_EQ(arena->free_bytes(), free_while_queued);  // the tensor still holds it
  tensor = Tensor();
  EXPECT_EQ(arena->free_bytes(), free_at_start);
  EXPECT_THROW(Storage::adopt_arena(*arena, offset), nodal::ShmError);  // a stale handle
}

TEST(ShareMemoryTest, AllocateLeavingKeepsTheRoomItIsAskedToKeep) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  auto arena = Arena::create(64 * kMiB);
  const std::size_t free_at_start = arena->free_bytes();
  EXPECT_EQ(arena->allocate_leaving(free_at_start + 1, 0), nullptr);  // more than there is
  EXPECT_EQ(arena->allocate_leaving(kMiB, free_at_start), nullptr);  // would cut into the room kept
  EXPECT_EQ(arena->allocate_leaving(SIZE_MAX, 0), nullptr);
  void* one = arena->allocate_leaving(kMiB, 8 * kMiB);
  ASSERT_NE(one, nullptr);
  EXPECT_LE(arena->free_bytes(), free_at_start - kMiB);
  arena->deallocate(one);
  // Two processes taking blocks at once, each until it is refused: together they never go
  // below the room kept (the check and the allocation are one step under the arena's lock).
  constexpr std::size_t kKeep = 16 * kMiB;
  pid_t children[2];
  for (pid_t& child : children) {
    child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      while (arena->allocate_leaving(kMiB, kKeep) != nullptr) {
      }  // the blocks are never freed
      _exit(0);
    }
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  EXPECT_GE(arena->free_bytes(), kKeep);
  EXPECT_LT(arena->free_bytes(), kKeep + 2 * kMiB);  // they did fill it up to the room kept
  EXPECT_NE(arena->allocate(8 * kMiB), nullptr);  // the room is there for a plain allocate()
}

TEST(ShareMemoryTest, AdoptRejectsOffsetsWithoutAStorage) {
  auto arena = Arena::create(64 << 20);
  EXPECT_THROW(Storage::adopt_arena(*arena, 4096 + 64), nodal::ShmError);
  EXPECT_THROW(Storage::adopt_arena(*arena, arena->size()), nodal::ShmError);
  EXPECT_THROW(Storage::adopt_arena(*arena, 100), nodal::ShmError);  // misaligned
}

TEST(ShareMemoryTest, ForkedChildWritesAreSeenByTheParent) {
  Tensor t = Tensor::zeros({256, 33}, DType::i32).share_memory();  // the arena exists before the fork
  Tensor direct = Tensor::empty_shared({1000}, DType::u8);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* p = t.data_ptr<std::int32_t>();
    for (std::int32_t i = 0; i < 256 * 33; ++i) p[i] = pattern(i);
    for (int i = 0; i < 1000; ++i) direct.data_ptr<std::uint8_t>()[i] = static_cast<std::uint8_t>(i * 7);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto* p = t.data_ptr<std::int32_t>();
  for (std::int32_t i = 0; i < 256 * 33; ++i) {
    ASSERT_EQ(p[i], pattern(i)) << i;
  }
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(direct.data_ptr<std::uint8_t>()[i], static_cast<std::uint8_t>(i * 7));
}

TEST(ShareMemoryTest, HundredThousandArenaTensorsOpenNoDescriptors) {
  nodal::detail::job_arena();  // its memfd is the one descriptor every tensor shares
  const int before = open_descriptors();
  std::vector<Tensor> tensors;
  tensors.reserve(100000);
  for (std::int32_t i = 0; i < 100000; ++i) {
    tensors.push_back(Tensor::empty_shared({4}, DType::i32));
    tensors.back().data_ptr<std::int32_t>()[3] = i;
  }
  EXPECT_EQ(open_descriptors(), before);
  for (std::int32_t i = 0; i < 100000; ++i) ASSERT_EQ(tensors[i].data_ptr<std::int32_t>()[3], i);
}

TEST(JobArenaTest, SizedByTheEnvironmentAndReplaceable) {
  ASSERT_TRUE(kJobArenaSizeSet);
  Arena& first = nodal::detail::job_arena();
  EXPECT_EQ(&nodal::detail::job_arena(), &first);
  // With --gtest_repeat, an earlier round replaced it already with the 64 MiB one below.
  EXPECT_TRUE(first.size() == kJobArenaBytes || first.size() == std::size_t{64} << 20) << first.size();

  Tensor old = Tensor::empty_shared({16}, DType::i32);
  iota(old);
  auto replacement = Arena::create(64 << 20);
  Arena* expected = replacement.get();
  nodal::detail::set_job_arena(std::move(replacement));
  EXPECT_EQ(&nodal::detail::job_arena(), expected);
  Tensor fresh = Tensor::empty_shared({16}, DType::i32);
  EXPECT_TRUE(expected->contains(fresh.data()));
  EXPECT_TRUE(first.contains(old.data()));  // the old arena stays mapped for tensors made before
  for (int i = 0; i < 16; ++i) ASSERT_EQ(old.data_ptr<std::int32_t>()[i], i);
}

TEST(FromFileTest, CreateWritesTheFileAndReadOnlySeesIt) {
  TempDir dir;
  const std::string path = (dir.path / "tensor.bin").string();
  Tensor written = Tensor::from_file(path, DType::i32, {5, 8}, nodal::FileMode::create);
  EXPECT_TRUE(written.is_shared());
  EXPECT_FALSE(written.in_arena());
  iota(written);
  EXPECT_EQ(fs::file_size(path), 160u);

  Tensor read = Tensor::from_file(path, DType::i32, {5, 8}, nodal::FileMode::read_only);
  EXPECT_NE(read.data(), written.data());
  EXPECT_TRUE(read.equal(written));

  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 160u);
  for (std::int32_t i = 0; i < 40; ++i) {
    std::int32_t value = 0;
    std::memcpy(&value, bytes.data() + 4 * i, 4);
    ASSERT_EQ(value, i);
  }

  // read_write sees the file and writes through to every mapping.
  Tensor rows = Tensor::from_file(path, DType::i32, {2, 8}, nodal::FileMode::read_write);
  rows.data_ptr<std::int32_t>()[9] = -9;
  EXPECT_EQ(read.data_ptr<std::int32_t>()[9], -9);

  // Files stay where they are: share_memory() does not copy them into the arena.
  rows.share_memory();
  EXPECT_FALSE(rows.in_arena());
  EXPECT_EQ(rows.data_ptr<std::int32_t>()[9], -9);
}

TEST(FromFileTest, EmptyTensorNeedsNoMapping) {
  TempDir dir;
  const std::string path = (dir.path / "empty.bin").string();
  Tensor t = Tensor::from_file(path, DType::f32, {0, 3}, nodal::FileMode::create);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(fs::file_size(path), 0u);
  EXPECT_TRUE(
      Tensor::from_file(path, DType::f32, {0}, nodal::FileMode::read_only).equal(Tensor::empty({0}, DType::f32)));
}

TEST(FromFileTest, TooSmallFileIsAUsageError) {
  TempDir dir;
  const std::string path = (dir.path / "small.bin").string();
  std::ofstream(path, std::ios::binary) << std::string(100, 'x');
  EXPECT_THROW(Tensor::from_file(path, DType::f32, {26}, nodal::FileMode::read_only), UsageError);
  EXPECT_THROW(Tensor::from_file(path, DType::f32, {26}, nodal::FileMode::read_write), UsageError);
  EXPECT_NO_THROW(Tensor::from_file(path, DType::f32, {25}, nodal::FileMode::read_only));
}

TEST(FromFileTest, MissingFileIsASystemErrorNamingIt) {
  TempDir dir;
  const std::string path = (dir.path / "missing.bin").string();
  try {
    Tensor::from_file(path, DType::f32, {4}, nodal::FileMode::read_only);
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
}

#ifdef NODAL_HAVE_DLPACK

/// Counts deleter calls of DLManagedTensors whose deleter was swapped for counting_deleter.
int deletions = 0;
void (*original_deleter)(DLManagedTensor*) = nullptr;
void counting_deleter(DLManagedTensor* self) {
  ++deletions;
  original_deleter(self);
}

TEST(DLPackTest, RoundTripSharesDataAndDeletesOnce) {
  deletions = 0;
  Tensor t = Tensor::empty({3, 4}, DType::f32);
  for (int i = 0; i < 12; ++i) t.data_ptr<float>()[i] = 0.5f * static_cast<float>(i);
  DLManagedTensor* managed = t.to_dlpack();
  const DLTensor& dl = managed->dl_tensor;
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.dtype.code, kDLFloat);
  EXPECT_EQ(dl.dtype.bits, 32);
  EXPECT_EQ(dl.dtype.lanes, 1);
  EXPECT_EQ(dl.shape[0], 3);
  EXPECT_EQ(dl.shape[1], 4);
  EXPECT_EQ(dl.strides[0], 4);
  EXPECT_EQ(dl.strides[1], 1);
  EXPECT_EQ(static_cast<char*>(dl.data) + dl.byte_offset, t.data());
  original_deleter = managed->deleter;
  managed->deleter = counting_deleter;

  Tensor back = Tensor::from_dlpack(managed);
  EXPECT_EQ(back.shape(), t.shape());
  EXPECT_EQ(back.dtype(), DType::f32);
  EXPECT_EQ(back.data(), t.data());  // no copy
  EXPECT_TRUE(back.equal(t));
  Tensor copy = back;
  t = Tensor();  // the export keeps the original storage alive
  EXPECT_EQ(copy.data_ptr<float>()[11], 5.5f);
  back = Tensor();
  EXPECT_EQ(deletions, 0);
  copy = Tensor();
  EXPECT_EQ(deletions, 1);
}

TEST(DLPackTest, DtypesSurviveTheRoundTrip) {
  for (DType dtype :
       {DType::bool_, DType::u8, DType::i8, DType::i32, DType::i64, DType::f16, DType::bf16, DType::f32, DType::f64}) {
    Tensor t = Tensor::zeros({2}, dtype);
    Tensor back = Tensor::from_dlpack(t.to_dlpack());
#if DLPACK_VERSION >= 80
    EXPECT_EQ(back.dtype(), dtype) << nodal::dtype_name(dtype);
#else
    // dlpack.h before 0.8 has no bool: it travels as u8.
    EXPECT_EQ(back.dtype(), dtype == DType::bool_ ? DType::u8 : dtype) << nodal::dtype_name(dtype);
#endif
  }
}

/// A producer's tensor over `values`, as another framework would hand it over.
struct Foreign {
  std::vector<std::int32_t> values;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  ///< empty: NULL strides
  DLManagedTensor managed{};
  bool deleted = false;

  Foreign(std::vector<std::int64_t> shape_, std::vector<std::int64_t> strides_, std::uint64_t byte_offset)
      : values(64), shape(std::move(shape_)), strides(std::move(strides_)) {
    std::iota(values.begin(), values.end(), 0);
    managed.dl_tensor = {values.data(),   {kDLCPU, 0},  static_cast<int>(shape.size()),
                         {kDLInt, 32, 1}, shape.data(), strides.empty() ? nullptr : strides.data(),
                         byte_offset};
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) { static_cast<Foreign*>(self->manager_ctx)->deleted = true; };
  }
};

TEST(DLPackTest, ImportsForeignStridesAndByteOffset) {
  Foreign foreign({3, 4}, {1, 5}, 2 * sizeof(std::int32_t));  // t[i][j] = values[2 + i + 5 j]
  {
    Tensor t = Tensor::from_dlpack(&foreign.managed);
    EXPECT_EQ(t.shape(), (Shape{3, 4}));
    EXPECT_EQ(t.strides(), (Shape{1, 5}));
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_EQ(t.data(), foreign.values.data() + 2);
    Tensor copy = t.clone();
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 4; ++j) ASSERT_EQ(copy.data_ptr<std::int32_t>()[i * 4 + j], 2 + i + 5 * j);
    }
    EXPECT_FALSE(foreign.deleted);
  }
  EXPECT_TRUE(foreign.deleted);
}

TEST(DLPackTest, ImportsNullStridesAsContiguousAndNegativeStrides) {
  Foreign compact({2, 3}, {}, 10 * sizeof(std::int32_t));  // values[10 .. 15]
  Tensor t = Tensor::from_dlpack(&compact.managed);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  for (int i = 0; i < 6; ++i) ASSERT_EQ(t.data_ptr<std::int32_t>()[i], 10 + i);

  Foreign reversed({4}, {-2}, 10 * sizeof(std::int32_t));  // values 10, 8, 6, 4
  Tensor r = Tensor::from_dlpack(&reversed.managed).clone();
  EXPECT_TRUE(reversed.deleted);  // the import went with its temporary; the clone is private
  for (int i = 0; i < 4; ++i) ASSERT_EQ(r.data_ptr<std::int32_t>()[i], 10 - 2 * i);
}

TEST(DLPackTest, ShareMemoryCopiesAnImportAndReleasesTheProducer) {
  Foreign foreign({8}, {}, 0);
  Tensor t = Tensor::from_dlpack(&foreign.managed);
  t.share_memory();
  EXPECT_TRUE(foreign.deleted);
  EXPECT_TRUE(t.in_arena());
  for (int i = 0; i < 8; ++i) ASSERT_EQ(t.data_ptr<std::int32_t>()[i], i);
}

TEST(DLPackTest, RejectsWhatNodalCannotHoldAndLeavesItToTheCaller) {
  Foreign complex({4}, {}, 0);
  complex.managed.dl_tensor.dtype = {kDLComplex, 64, 1};
  EXPECT_THROW(Tensor::from_dlpack(&complex.managed), UsageError);
  Foreign vector({4}, {}, 0);
  vector.managed.dl_tensor.dtype = {kDLInt, 32, 4};
  EXPECT_THROW(Tensor::from_dlpack(&vector.managed), UsageError);
  Foreign gpu({4}, {}, 0);
  gpu.managed.dl_tensor.device = {kDLCUDA, 0};
  EXPECT_THROW(Tensor::from_dlpack(&gpu.managed), UsageError);
  Foreign negative({-4}, {}, 0);
  EXPECT_THROW(Tensor::from_dlpack(&negative.managed), UsageError);
  EXPECT_THROW(Tensor::from_dlpack(nullptr), UsageError);
  EXPECT_FALSE(complex.deleted || vector.deleted || gpu.deleted || negative.deleted);
  EXPECT_THROW(Tensor().to_dlpack(), UsageError);
}

#else

TEST(DLPackTest, WithoutDlpackHeaderBothCallsThrow) {
  EXPECT_THROW(Tensor::empty({1}, DType::f32).to_dlpack(), UsageError);
  EXPECT_THROW(Tensor::from_dlpack(nullptr), UsageError);
}

#endif

}  // namespace
