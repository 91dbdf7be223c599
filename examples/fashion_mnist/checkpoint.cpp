#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/vector.hpp>
#include <fmt/format.h>

namespace fashion_mnist {

Checkpoint checkpoint_of(const Plan& plan, const Options& options) {
  Checkpoint c;
  c.seed = plan.seed;
  c.train_size = plan.train_size;
  c.global_batch = plan.global_batch;
  c.shards = plan.shards;
  c.epochs = plan.epochs;
  c.learning_rate = options.learning_rate;
  c.momentum = options.momentum;
  return c;
}

void save_checkpoint(const Checkpoint& checkpoint, const std::string& path) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(fmt::format("checkpoint: cannot create {}: {}", temporary, std::strerror(errno)));
    boost::archive::binary_oarchive archive(out);
    archive << checkpoint;
    out.close();
    if (!out) throw std::runtime_error(fmt::format("checkpoint: cannot write {}", temporary));
  }
  // On disk before it replaces the old one: a crash after the rename must not leave an empty file.
  int fd = ::open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    throw std::runtime_error(fmt::format("checkpoint: cannot replace {}: {}", path, std::strerror(error)));
  }
}

std::optional<Checkpoint> load_checkpoint(const std::string& path, const Plan& plan, const Options& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::nullopt;
    throw std::runtime_error(fmt::format("checkpoint: cannot open {}: {}", path, std::strerror(errno)));
  }
  Checkpoint c;
  try {
    boost::archive::binary_iarchive archive(in);
    archive >> c;
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("checkpoint: {} is not a readable checkpoint ({}): remove it", path, e.what()));
  }
  const Checkpoint expected = checkpoint_of(plan, options);
  if (c.seed != expected.seed || c.train_size != expected.train_size || c.global_batch != expected.global_batch ||
      c.shards != expected.shards || c.epochs != expected.epochs || c.learning_rate != expected.learning_rate ||
      c.momentum != expected.momentum || c.next_step < 0 || c.next_step > plan.total_steps()) {
    throw std::runtime_error(fmt::format(
        "checkpoint: {} belongs to another run (seed {}, {} samples, global batch {}, {} shards, {} epochs, lr {}, "
        "momentum {}); this run has seed {}, {} samples, global batch {}, {} shards, {} epochs, lr {}, momentum {}: "
        "remove it or pass another --checkpoint",
        path, c.seed, c.train_size, c.global_batch, c.shards, c.epochs, c.learning_rate, c.momentum, expected.seed,
        expected.train_size, expected.global_batch, expected.shards, expected.epochs, expected.learning_rate,
        expected.momentum));
  }
  return c;
}

}  // namespace fashion_mnist
