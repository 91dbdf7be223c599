#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/termination_shield.hpp>
#include <nodal/detail/units.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <boost/interprocess/managed_external_buffer.hpp>
#include <fmt/format.h>

namespace nodal {
namespace {

namespace bip = boost::interprocess;

constexpr std::size_t kPage = 4096;
/// ArenaControl lives in the first page; Boost's segment manager starts after it.
constexpr std::size_t kControlBytes = kPage;
/// Reserved at creation: the control page and the segment manager's own bookkeeping.
constexpr std::size_t kHeaderReserve = 64 * 1024;
/// Pages are reserved in chunks of at least this many bytes (larger for arenas above 48 GiB).
constexpr unsigned kMinReserveShift = 21;


std::size_t align_down(std::size_t value, std::size_t alignment) { return value / alignment * alignment; }
std::size_t align_up(std::size_t value, std::size_t alignment) { return align_down(value + alignment - 1, alignment); }

/// Memory the kernel can still give to shared memory, in bytes: MemAvailable for a memfd arena
/// (shmem is charged to memory, not to /dev/shm), the free space of the directory otherwise.
std::size_t available_bytes(const std::string& directory) {
  if (!directory.empty()) {
    struct statvfs fs {};
    if (::statvfs(directory.c_str(), &fs) == 0) return static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize;
    return 0;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string directory_of(int fd) {
  // A file_system arena's directory, from the descriptor; empty for a memfd.
  char link[64];
  char target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return {};
  std::string path(target, static_cast<std::size_t>(n));
  if (path.rfind("/memfd:", 0) == 0) return {};
  return path.substr(0, path.rfind('/'));
}

[[noreturn]] void throw_shm(const std::string& what) { throw ShmError(what); }

}  // namespace

/// Boost's managed_external_buffer typedef uses null_mutex_family (one process only); ours locks
/// with process-shared, robust mutexes, since every rank allocates.
using SharedBuffer = bip::basic_managed_external_buffer<char, bip::rbtree_best_fit<bip::mutex_family>, bip::iset_index>;

struct Arena::Segment {
  SharedBuffer buffer;
};

Arena::Arena(int fd, std::byte* base, std::size_t size, bool create) : fd_(fd), base_(base), size_(size) {
  segment_ = std::make_unique<Segment>();
  const std::size_t start = kControlBytes + control().front_bytes;
  try {
    if (create) {
      segment_->buffer = SharedBuffer(bip::create_only, base + start, size - start);
    } else {
      segment_->buffer = SharedBuffer(bip::open_only, base + start, size - start);
    }
  } catch (const std::exception& e) {
    // The caller still owns fd (and unlinks a file it created).
    ::munmap(base_, size_);
    base_ = nullptr;
    fd_ = -1;
    throw_shm(fmt::format("cannot set up the shared arena ({}): {}", detail::format_bytes(size), e.what()));
  }
}

Arena::~Arena() {
  segment_.reset();
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void* Arena::front() const noexcept { return base_ + kControlBytes; }

std::unique_ptr<Arena> Arena::create(std::size_t bytes, ShmStrategy strategy, const std::string& path,
                                     std::size_t front_bytes) {
  front_bytes = align_up(front_bytes, kPage);
  bytes = align_up(std::max(bytes, kHeaderReserve * 2 + front_bytes), kPage);
  int fd = -1;
  std::string directory;
  if (strategy == ShmStrategy::file_descriptor) {
    fd = ::memfd_create("nodal-arena", MFD_CLOEXEC);
    if (fd < 0) throw_shm(fmt::format("memfd_create failed: {}", std::strerror(errno)));
  } else {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw_shm(fmt::format("cannot create the shared arena {}: {}", path, std::strerror(errno)));
    directory = path.substr(0, path.rfind('/'));
  }
  auto fail = [&](const std::string& why) {
    ::close(fd);
    if (!path.empty()) ::unlink(path.c_str());
    throw_shm(why);
  };
  std::size_t available = available_bytes(directory);
  if (bytes > available) {
    fail(fmt::format("the shared arena needs {} but {} has {}: lower --shm-size or free {}", detail::format_bytes(bytes),
                     directory.empty() ? "memory" : directory, detail::format_bytes(available),
                     directory.empty() ? "memory" : directory));
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) < 0) fail(fmt::format("ftruncate: {}", std::strerror(errno)));
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(kHeaderReserve + front_bytes)); rc != 0) {
    fail(fmt::format("cannot reserve the shared arena's first {}: {}", detail::format_bytes(kHeaderReserve + front_bytes),
                     std::strerror(rc)));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) fail(fmt::format("mmap of the shared arena ({}): {}", detail::format_bytes(bytes), std::strerror(errno)));
  static_assert(sizeof(ArenaControl) <= kControlBytes);
  auto* control = new (base) ArenaControl{};
  control->magic = ArenaControl::kMagic;
  control->size = bytes;
  control->failed_rank = -1;
  control->reserve_shift = kMinReserveShift;
  control->front_bytes = front_bytes;
  while ((bytes >> control->reserve_shift) >= ArenaControl::kReserveWords * 64) ++control->reserve_shift;
  try {
    return std::unique_ptr<Arena>(new Arena(fd, static_cast<std::byte*>(base), bytes, true));
  } catch (const ShmError& e) {
    fail(e.what());
    throw;  // not reached: fail throws
  }
}

std::unique_ptr<Arena> Arena::attach(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) < 0) throw_shm(fmt::format("the inherited arena descriptor {} is not open: {}", fd, std::strerror(errno)));
  auto bytes = static_cast<std::size_t>(st.st_size);
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw_shm(fmt::format("mmap of the shared arena ({}): {}", detail::format_bytes(bytes), std::strerror(errno)));
  auto* control = static_cast<ArenaControl*>(base);
  if (bytes < kHeaderReserve || control->magic != ArenaControl::kMagic || control->size != bytes) {
    ::munmap(base, bytes);
    throw_shm(fmt::format("descriptor {} does not hold a nodal arena", fd));
  }
  detail::set_cloexec(fd, true);
  return std::unique_ptr<Arena>(new Arena(fd, static_cast<std::byte*>(base), bytes, false));  // owns fd from here
}

std::unique_ptr<Arena> Arena::attach(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw_shm(fmt::format("cannot open the shared arena {}: {}", path, std::strerror(errno)));
  try {
    return attach(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

void Arena::reserve_pages(const void* pointer, std::size_t bytes) {
  ArenaControl& c = control();
  // From the allocator's block header just before `pointer` to one page past the end, where the
  // header of the next free block goes.
  std::size_t first = offset_of(pointer) - std::min<std::size_t>(offset_of(pointer), 64);
  std::size_t last = std::min(size_, offset_of(pointer) + bytes + kPage);
  for (std::size_t chunk = first >> c.reserve_shift; chunk <= (last - 1) >> c.reserve_shift; ++chunk) {
    std::atomic<std::uint64_t>& word = c.reserved[chunk / 64];
    const std::uint64_t bit = std::uint64_t{1} << (chunk % 64);
    if (word.load(std::memory_order_acquire) & bit) continue;
    std::size_t begin = chunk << c.reserve_shift;
    std::size_t length = std::min(size_, begin + (std::size_t{1} << c.reserve_shift)) - begin;
    // Two processes may reserve the same chunk at once: posix_fallocate is idempotent.
    if (int rc = ::posix_fallocate(fd_, static_cast<off_t>(begin), static_cast<off_t>(length)); rc != 0) {
      std::size_t available = available_bytes(directory_of(fd_));
      throw_shm(fmt::format("need {} of shared memory for an allocation, but {} has {} ({}): free memory, "
                            "or with the file_system strategy make its directory larger",
                            detail::format_bytes(bytes), directory_of(fd_).empty() ? "the machine" : directory_of(fd_),
                            detail::format_bytes(available), std::strerror(rc)));
    }
    word.fetch_or(bit, std::memory_order_release);
  }
}

void* Arena::allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kPage) {
    throw UsageError(fmt::format("Arena::allocate: alignment {} is not a power of two up to 4096", alignment));
  }
  void* p = nullptr;
  const detail::TerminationShield shield;  // a SIGTERM here would leave the allocator locked
  try {
    p = segment_->buffer.allocate_aligned(std::max<std::size_t>(bytes, 1), alignment, std::nothrow);
  } catch (const bip::interprocess_exception& e) {
    throw PeerFailure(fmt::format("the shared arena's allocator is unusable ({}): a process died while allocating",
                                  e.what()));
  }
  if (!p) {
    throw_shm(fmt::format("the shared arena is full: need {}, {} free of {}: raise nodalrun --shm-size",
                          detail::format_bytes(bytes), detail::format_bytes(free_bytes()), detail::format_bytes(size_)));
  }
  try {
    reserve_pages(p, bytes);
  } catch (...) {
    segment_->buffer.deallocate(p);
    throw;
  }
  return p;
}

void Arena::with_index_lock(const std::function<void()>& body) {
  try {
    const detail::TerminationShield shield;  // a SIGTERM inside would leave the lock held
    segment_->buffer.get_segment_manager()->atomic_func(body);
  } catch (const bip::interprocess_exception& e) {
    throw PeerFailure(fmt::format("the shared arena's index is unusable ({}): a process died while using it", e.what()));
  }
}

void* Arena::allocate_leaving(std::size_t bytes, std::size_t keep, std::size_t alignment) {
  void* result = nullptr;
  auto body = [&] {
    const std::size_t free = free_bytes();
    if (bytes > free || free - bytes < keep) return;
    result = allocate(bytes, alignment);
  };
  with_index_lock(body);
  return result;
}

void Arena::deallocate(void* pointer) noexcept {
  // The pages stay reserved: the next tensor of that size reuses them without faulting them in
  // again (the one-copy path is then a plain memcpy). They go back to the kernel with the arena.
  if (!pointer) return;
  const detail::TerminationShield shield;
  try {
    segment_->buffer.deallocate(pointer);
  } catch (const bip::interprocess_exception&) {
    // The allocator's robust mutex is unrecoverable: a rank died inside allocate(). The job is
    // lost (nodalrun is stopping it); leaking this block is the only safe thing left to do.
  }
}

std::size_t Arena::free_bytes() const { return segment_->buffer.get_free_memory(); }

void* Arena::find_or_create(const char* name, std::size_t bytes, std::size_t alignment,
                            const std::function<void(void*)>& construct) {
  // The name maps to a small record {offset, bytes}; the object itself comes from allocate(), so
  // its pages are reserved before anything touches them, and it is registered only once built.
  void* result = nullptr;
  auto body = [&] {
    auto [record, count] = segment_->buffer.find<std::uint64_t>(name);
    if (record) {
      if (record[1] != bytes) {
        throw UsageError(fmt::format("the shared object '{}' exists with another type or size ({} bytes, not {})",
                                     name, record[1], bytes));
      }
      result = at(record[0]);
      return;
    }
    void* block = allocate(bytes, std::max<std::size_t>(alignment, 64));
    try {
      construct(block);
    } catch (...) {
      deallocate(block);
      throw;
    }
    std::uint64_t* created = segment_->buffer.construct<std::uint64_t>(name, std::nothrow)[2](0);
    if (!created) {
      deallocate(block);
      throw_shm(fmt::format("the shared arena is full: no room to name '{}': raise nodalrun --shm-size", name));
    }
    created[0] = offset_of(block);
    created[1] = bytes;
    result = block;
  };
  with_index_lock(body);
  return result;
}

void* Arena::find(const char* name) {
  void* result = nullptr;
  with_index_lock([&] {
    auto [record, count] = segment_->buffer.find<std::uint64_t>(name);
    if (record) result = at(record[0]);
  });
  return result;
}

void Arena::destroy(const char* name) {
  with_index_lock([&] {
    auto [record, count] = segment_->buffer.find<std::uint64_t>(name);
    if (!record) return;
    deallocate(at(record[0]));
    segment_->buffer.destroy<std::uint64_t>(name);
  });
}

}  // namespace nodal
