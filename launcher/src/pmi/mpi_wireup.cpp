#include "mpi_wireup.hpp"

#include "pmix_host.hpp"

#include <nodal/detail/posix.hpp>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

/// PMIx's events in PMI-1's words (the job's rules are the same for both).
std::vector<MpiEvent> as_mpi_events(std::vector<PmixEvent> events) {
  std::vector<MpiEvent> out;
  for (PmixEvent& e : events) {
    MpiEvent::Kind kind = MpiEvent::Kind::init;
    if (e.kind == PmixEvent::Kind::finalized) kind = MpiEvent::Kind::finalize;
    if (e.kind == PmixEvent::Kind::abort) kind = MpiEvent::Kind::abort;
    out.push_back({kind, e.rank, e.status, std::move(e.message)});
  }
  return out;
}

}  // namespace

MpiWireUp::MpiWireUp(MpiSupport support, const std::string& job_id, int size)
    : states_(static_cast<std::size_t>(size), State::not_started) {
  if (support == MpiSupport::automatic || support == MpiSupport::pmi1) {
    pmi1_ = std::make_unique<Pmi1Server>(fmt::format("kvs_{}", job_id), size);
    for (int r = 0; r < size; ++r) fds_.push_back(pmi1_->server_fd(r));
  }
  // auto offers PMIx where this nodalrun was built with libpmix (cli.cpp refuses --mpi pmix otherwise).
  if ((support == MpiSupport::automatic && pmix_built()) || support == MpiSupport::pmix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = fmt::format("{}/nodalrun-pmix-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
    if (::mkdtemp(pattern.data()) == nullptr) detail::throw_errno(fmt::format("mkdtemp({})", pattern));
    pmix_dir_ = pattern;
    try {
      pmix_ = std::make_unique<PmixHost>(job_id, size, pmix_dir_);
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove_all(pmix_dir_, ignored);
      throw;
    }
    fds_.push_back(pmix_->event_fd());
  }
}

MpiWireUp::~MpiWireUp() {
  pmix_.reset();
  if (!pmix_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(pmix_dir_, ignored);
  }
}

std::vector<std::string> MpiWireUp::environment(int rank) {
  std::vector<std::string> env;
  if (pmi1_) env = pmi1_->environment(rank);
  if (pmix_) {
    std::vector<std::string> more = pmix_->client_environment(rank);
    env.insert(env.end(), more.begin(), more.end());
  }
  return env;
}

std::vector<int> MpiWireUp::inherited_fds(int rank) const {
  if (!pmi1_) return {};
  return {pmi1_->client_fd(rank)};
}

void MpiWireUp::ranks_started() {
  if (pmi1_) pmi1_->close_client_ends();
}

std::optional<MpiFailure> MpiWireUp::on_readable(std::size_t index) {
  if (pmi1_ && index < states_.size()) return observe(pmi1_->on_readable(static_cast<int>(index)));
  if (pmix_) return observe(as_mpi_events(pmix_->take_events()));
  return std::nullopt;
}

std::optional<MpiFailure> MpiWireUp::on_rank_exit(int rank, bool clean) {
  // What it said just before it exited may still be unread.
  if (pmi1_) {
    if (std::optional<MpiFailure> failure = observe(pmi1_->on_readable(rank))) return failure;
  }
  if (pmix_) {
    if (std::optional<MpiFailure> failure = observe(as_mpi_events(pmix_->take_events()))) return failure;
  }
  if (!clean) return std::nullopt;
  State& state = states_[static_cast<std::size_t>(rank)];
  if (state == State::started) {
    return MpiFailure{rank, 1, "exited with code 0 without calling MPI_Finalize"};
  }
  if (state == State::not_started) {
    state = State::left_without_init;
    if (any_started_) {
      return MpiFailure{rank, 1,
                        "exited with code 0 without calling MPI_Init, while the other ranks started MPI (they "
                        "would wait for it in MPI_Init or their first collective forever)"};
    }
  }
  return std::nullopt;
}

std::optional<MpiFailure> MpiWireUp::observe(const std::vector<MpiEvent>& events) {
  std::optional<MpiFailure> failure;
  auto fail = [&failure](MpiFailure f) {
    if (!failure) failure = std::move(f);
  };
  for (const MpiEvent& event : events) {
    if (event.rank < 0 || event.rank >= static_cast<int>(states_.size())) continue;
    State& state = states_[static_cast<std::size_t>(event.rank)];
    switch (event.kind) {
      case MpiEvent::Kind::init:
        state = State::started;
        if (!any_started_) {
          any_started_ = true;
          for (std::size_t r = 0; r < states_.size(); ++r) {
            if (states_[r] == State::left_without_init) {
              fail({static_cast<int>(r), 1,
                    fmt::format("exited with code 0 without calling MPI_Init, while rank {} started MPI (it "
                                "would wait for it in MPI_Init or its first collective forever)",
                                event.rank)});
            }
          }
        }
        break;
      case MpiEvent::Kind::finalize:
        state = State::finalized;
        break;
      case MpiEvent::Kind::abort: {
        // MPI_Abort's error code is the job's exit code, as mpirun and Hydra make it; one that is
        // 0 modulo 256 would read as success, so it becomes 1.
        const int code = (event.code & 0xff) != 0 ? (event.code & 0xff) : 1;
        fail({event.rank, code,
              fmt::format("called MPI_Abort with error code {}{}", event.code,
                          event.message.empty() ? std::string() : ": " + event.message)});
        break;
      }
      case MpiEvent::Kind::protocol:
        fail({event.rank, 1, event.message});
        break;
    }
  }
  return failure;
}

}  // namespace nodal::launcher
