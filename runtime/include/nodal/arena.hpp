// The job's shared arena: one shared-memory region every rank maps, from which tensors, queues,
// locks and collective buffers are allocated. Handing something to another rank passes an offset
// into it, never the bytes. See DESIGN.md "The shared arena".
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace nodal {

/// Where the arena's memory lives.
enum class ShmStrategy {
  /// An anonymous memfd (default): freed by the kernel when the last process holding it dies, so
  /// nothing can leak, even after SIGKILL of every process.
  file_descriptor,
  /// A named file in a shared-memory directory (/dev/shm by default) that processes not started
  /// by nodalrun can attach by path; nodalrun removes it when the job ends, however it ends.
  file_system,
};

/// The job's state every rank sees, at the start of the arena. Internal fields are the launcher's
/// and the runtime's; users read it through Context.
struct ArenaControl {
  static constexpr std::uint64_t kMagic = 0x6c61646f6e2d3031ULL;  // "10-nodal"
  std::uint64_t magic;
  std::uint64_t size;  ///< bytes of the whole arena
  /// Non-zero once the job has failed: every blocking nodal call throws PeerFailure.
  alignas(64) std::atomic<std::uint32_t> abort;
  std::int32_t failed_rank;  ///< the (global) rank that failed first; -1 when no rank is to blame
  char failure[256];  ///< what failed, in words (NUL-terminated)
  /// Which chunks of the arena have their pages reserved (posix_fallocate), one bit a chunk of
  /// 2^reserve_shift bytes: an allocation in reserved chunks needs no system call.
  std::uint32_t reserve_shift;
  static constexpr std::size_t kReserveWords = 384;  ///< 24576 chunks: 48 GiB in 2 MiB chunks
  alignas(64) std::atomic<std::uint64_t> reserved[kReserveWords];
  /// Bytes right after this block (page-aligned) that the allocator never hands out: the
  /// creator's fixed tables, reserved with the header at creation (Arena::create's front_bytes).
  std::uint64_t front_bytes;
  /// The wait table (detail/wait_table.hpp): its offset in the arena (0: none) and its rows.
  std::uint64_t wait_table_offset;
  std::int32_t wait_table_ranks;
  /// Bumped by nodalrun to ask every thread waiting in a nodal call for its stack; each answers
  /// once per request on the control channel (ControlKind::wait_stack).
  alignas(64) std::atomic<std::uint32_t> stack_request;
};

/// A mapped arena. Not copyable; the process's own is nodal::Context::arena() / detail::job_arena().
class Arena {
 public:
  /// Creates an arena of `bytes` (the --shm-size). The space is not taken up front: every
  /// allocation reserves its pages with posix_fallocate, so running out is a ShmError at
  /// allocation ("need X, have Y"), never a SIGBUS when the memory is touched.
  /// file_system: the file is `path` (created, must not exist). `front_bytes`: a region after the
  /// control block, outside the allocator, whose pages are reserved now (front()): for tables
  /// whose size is known up front, so that they cost no allocation and can never be the reason an
  /// allocation runs out of pages. Throws ShmError.
  static std::unique_ptr<Arena> create(std::size_t bytes, ShmStrategy strategy = ShmStrategy::file_descriptor,
                                       const std::string& path = {}, std::size_t front_bytes = 0);
  /// Maps the arena behind an inherited descriptor (what nodal::init() does). Throws ShmError.
  static std::unique_ptr<Arena> attach(int fd);
  /// Maps a file_system arena by path. Throws ShmError.
  static std::unique_ptr<Arena> attach(const std::string& path);

  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  /// `bytes` of shared memory aligned to `alignment` (a power of two, at most 4096), its pages
  /// reserved (in 2 MiB chunks, so most allocations make no system call). Throws ShmError when the arena or the machine has too little room; the message
  /// says how much was needed and how much is left.
  void* allocate(std::size_t bytes, std::size_t alignment = 64);
  /// allocate(), unless that would leave less than `keep` bytes free: then nullptr. The check and
  /// the allocation happen under the arena's index lock, so callers of allocate_leaving() in any
  /// process never take the arena below `keep` together (plain allocate() calls still may). For an
  /// optional user of the arena that must leave room to nodal (the torch arena allocator). Throws
  /// as allocate() when the room is there but fragmented, PeerFailure when a process died
  /// holding the lock.
  void* allocate_leaving(std::size_t bytes, std::size_t keep, std::size_t alignment = 64);
  /// Returns memory from allocate(). Its pages stay reserved for the next allocation; the kernel
  /// gets them back when the job ends.
  void deallocate(void* pointer) noexcept;

  /// The object named `name` of type T, constructed as T(args...) by the first caller in any
  /// process; later callers in any process get the same object. Names are per arena (per job).
  /// T must be usable from several processes at once (no pointers inside, only offsets).
  /// Throws ShmError when the arena is full.
  template <class T, class... Args>
  T& find_or_construct(const char* name, Args&&... args) {
    void* p = find_or_create(name, sizeof(T), alignof(T), [&](void* where) { new (where) T(std::forward<Args>(args)...); });
    return *static_cast<T*>(p);
  }
  /// The untyped form: `bytes` aligned to `alignment` (at least 64, at most 4096), `construct`
  /// run once on creation, under the arena's lock (Boost.Interprocess atomic_func on a robust
  /// mutex). Throws UsageError when the name exists with another size, ShmError when full,
  /// PeerFailure when a process died holding the lock.
  void* find_or_create(const char* name, std::size_t bytes, std::size_t alignment,
                       const std::function<void(void*)>& construct);

  /// The object named `name`, or nullptr when there is none. Throws PeerFailure when a process
  /// died holding the arena's lock.
  void* find(const char* name);
  /// Frees the object named `name` and its name (nothing when there is none): the caller makes
  /// sure that no process uses it any more. Throws PeerFailure as find().
  void destroy(const char* name);

  bool contains(const void* pointer) const noexcept {
    auto p = static_cast<const std::byte*>(pointer);
    return p >= base_ && p < base_ + size_;
  }
  /// Offsets are the same in every process; pointers are not.
  std::uint64_t offset_of(const void* pointer) const noexcept {
    return static_cast<std::uint64_t>(static_cast<const std::byte*>(pointer) - base_);
  }
  void* at(std::uint64_t offset) const noexcept { return base_ + offset; }

  std::size_t size() const noexcept { return size_; }
  std::size_t free_bytes() const;
  int fd() const noexcept { return fd_; }
  ArenaControl& control() const noexcept { return *reinterpret_cast<ArenaControl*>(base_); }
  /// The front region (create's front_bytes; control().front_bytes long, page-aligned).
  void* front() const noexcept;

 private:
  Arena(int fd, std::byte* base, std::size_t size, bool create);
  void reserve_pages(const void* pointer, std::size_t bytes);
  /// Runs `body` under the arena's index lock (Boost.Interprocess atomic_func on a robust mutex).
  /// Throws PeerFailure when a process died holding it, and what `body` throws.
  void with_index_lock(const std::function<void()>& body);

  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  struct Segment;  // Boost.Interprocess managed_external_buffer over the region after ArenaControl
  std::unique_ptr<Segment> segment_;
};

}  // namespace nodal
