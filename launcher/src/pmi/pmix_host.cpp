#include "pmix_host.hpp"

#include <pmix.h>  // PMIx_Error_string, PMIx_Info_load
#include <pmix_server.h>

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "../topology.hpp"

namespace nodal::launcher {

bool pmix_built() noexcept { return true; }

struct PmixHost::State {
  int event_fd = -1;
  std::mutex mutex;               // guards `events`, `connected` and the eventfd's count
  std::vector<PmixEvent> events;  // the callbacks' queue, oldest first
  std::set<int> connected;        // ranks whose connection PMIx completed (client_connected)

  void post(PmixEvent event) {
    std::lock_guard lock(mutex);
    if (event.kind == PmixEvent::Kind::connected) connected.insert(event.rank);
    events.push_back(std::move(event));
    const std::uint64_t one = 1;
    // Cannot fail short of 2^64 - 2 unread events; never blocks (EFD_NONBLOCK).
    [[maybe_unused]] ssize_t written = ::write(event_fd, &one, sizeof one);
  }
};

namespace {

[[noreturn]] void fail(const char* what, pmix_status_t status) {
  throw std::runtime_error(fmt::format("{}: {}", what, PMIx_Error_string(status)));
}

bool ok(pmix_status_t status) { return status == PMIX_SUCCESS || status == PMIX_OPERATION_SUCCEEDED; }

/// A pmix_info_t array built key by key (PMIx_Info_load copies each value in).
class InfoArray {
 public:
  InfoArray() = default;
  InfoArray(const InfoArray&) = delete;
  InfoArray& operator=(const InfoArray&) = delete;
  ~InfoArray() {
    for (pmix_info_t& info : infos_) {
      if (info.value.type == PMIX_TOPO) info.value.data.topo = nullptr;  // borrowed: add_topology
      PMIX_INFO_DESTRUCT(&info);
    }
  }

  void add(const char* key, const void* value, pmix_data_type_t type) {
    infos_.emplace_back();
    PMIX_INFO_CONSTRUCT(&infos_.back());
    const pmix_status_t status = PMIx_Info_load(&infos_.back(), key, value, type);
    if (!ok(status)) fail(key, status);
  }
  void add_u32(const char* key, std::uint32_t value) { add(key, &value, PMIX_UINT32); }
  void add_u16(const char* key, std::uint16_t value) { add(key, &value, PMIX_UINT16); }
  void add_rank(const char* key, pmix_rank_t value) { add(key, &value, PMIX_PROC_RANK); }
  void add_bool(const char* key, bool value) { add(key, &value, PMIX_BOOL); }
  void add_string(const char* key, const std::string& value) { add(key, value.c_str(), PMIX_STRING); }
  /// `topology` by pointer, not copied. PMIx_Info_load would hwloc_topology_dup() it, and the
  /// destructor destroy that copy, which PMIx_server_init keeps using: it keeps the hwloc
  /// pointer it is given (pmix_hwloc_setup_topology), and never destroys it.
  void add_topology(const char* key, pmix_topology_t* topology) {
    infos_.emplace_back();
    PMIX_INFO_CONSTRUCT(&infos_.back());
    PMIX_LOAD_KEY(infos_.back().key, key);
    infos_.back().value.type = PMIX_TOPO;
    infos_.back().value.data.topo = topology;
  }
  /// `items` as one PMIX_DATA_ARRAY value (copied).
  void add_array(const char* key, InfoArray& items) {
    pmix_data_array_t array{};
    array.type = PMIX_INFO;
    array.size = items.infos_.size();
    array.array = items.infos_.data();
    add(key, &array, PMIX_DATA_ARRAY);
  }

  pmix_info_t* data() { return infos_.data(); }
  std::size_t size() const { return infos_.size(); }

 private:
  std::vector<pmix_info_t> infos_;
};

/// "0,1,...,n-1"
std::string rank_list(int n) {
  std::string out;
  for (int rank = 0; rank < n; ++rank) {
    if (rank > 0) out += ',';
    out += std::to_string(rank);
  }
  return out;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

/// A regex from PMIx_generate_regex/ppn (a string, or a binary blob for long input): loaded as
/// PMIX_REGEX, which the library knows how to size and copy.
void add_regex(InfoArray& infos, const char* key, pmix_status_t (*generate)(const char*, char**),
               const std::string& input) {
  char* regex = nullptr;
  const pmix_status_t status = generate(input.c_str(), &regex);
  if (!ok(status)) fail(key, status);
  try {
    infos.add(key, regex, PMIX_REGEX);
  } catch (...) {
    std::free(regex);
    throw;
  }
  std::free(regex);
}

// ---- The server module's callbacks: all on PMIx's progress thread. They must not call back
// ---- into the blocking PMIx_server_* functions (those wait for this very thread).

/// The server_object a client was registered with: its PmixHost's state, which outlives every
/// callback about the client (~PmixHost deregisters the namespace first).
PmixHost::State* state_of(void* server_object) { return static_cast<PmixHost::State*>(server_object); }

pmix_status_t on_client_connected(const pmix_proc_t* proc, void* server_object, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  if (PmixHost::State* state = state_of(server_object))
    state->post({PmixEvent::Kind::connected, static_cast<int>(proc->rank), 0, {}});
  // PMIx 4.2 passes no cbfunc here and takes PMIX_OPERATION_SUCCEEDED as "done, no callback";
  // a library that passes one is answered through it.
  if (cbfunc) {
    cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
  }
  return PMIX_OPERATION_SUCCEEDED;
}

pmix_status_t on_client_finalized(const pmix_proc_t* proc, void* server_object, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  if (PmixHost::State* state = state_of(server_object))
    state->post({PmixEvent::Kind::finalized, static_cast<int>(proc->rank), 0, {}});
  if (cbfunc) {  // PMIx 4.2 always passes one; without, "done" tells the library to answer
    cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
  }
  return PMIX_OPERATION_SUCCEEDED;
}

pmix_status_t on_abort(const pmix_proc_t* proc, void* server_object, int status, const char msg[], pmix_proc_t procs[],
                       size_t nprocs, pmix_op_cbfunc_t cbfunc, void* cbdata) {
  // `procs` (none: the whole namespace) is who the client wants killed: with one job per
  // nodalrun that is always the job, and nodalrun ends it; nothing is killed here.
  (void)procs;
  (void)nprocs;
  if (PmixHost::State* state = state_of(server_object))
    state->post({PmixEvent::Kind::abort, static_cast<int>(proc->rank), status, msg ? msg : ""});
  // The event is queued before the client hears back, so before it can exit: Open MPI's
  // MPI_Abort _exit()s with the errorcode as soon as PMIx_Abort returns.
  if (cbfunc) cbfunc(PMIX_SUCCESS, cbdata);
  return PMIX_SUCCESS;
}

void release_copy(void* data) { std::free(data); }

pmix_status_t on_fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo, char* data,
                          size_t ndata, pmix_modex_cbfunc_t cbfunc, void* cbdata) {
  (void)procs;
  (void)nprocs;
  (void)info;
  (void)ninfo;
  // One node: the library called us only once every local participant contributed, and `data`
  // is all of it, so it is the fence's whole result. `data` stays the library's; the library's
  // cbfunc only records the pointer and finishes on its thread later, so hand it a copy of ours
  // that it releases (release_copy) when done.
  char* copy = nullptr;
  if (ndata > 0) {
    copy = static_cast<char*>(std::malloc(ndata));
    if (!copy) return PMIX_ERR_NOMEM;
    std::memcpy(copy, data, ndata);
  }
  cbfunc(PMIX_SUCCESS, copy, ndata, cbdata, copy ? release_copy : nullptr, copy);
  return PMIX_SUCCESS;
}

pmix_status_t on_direct_modex(const pmix_proc_t* proc, const pmix_info_t info[], size_t ninfo,
                              pmix_modex_cbfunc_t cbfunc, void* cbdata) {
  // Every rank is local: the library serves their data itself and asks the host only about
  // ranks on other nodes, of which there are none.
  (void)proc;
  (void)info;
  (void)ninfo;
  (void)cbfunc;
  (void)cbdata;
  return PMIX_ERR_NOT_SUPPORTED;
}

pmix_server_module_t make_module() {
  pmix_server_module_t module{};  // every other callback NULL: clients get "not supported"
  module.client_connected = on_client_connected;
  module.client_finalized = on_client_finalized;
  module.abort = on_abort;
  module.fence_nb = on_fence_nb;
  module.direct_modex = on_direct_modex;
  return module;
}

pmix_server_module_t g_module = make_module();  // PMIx keeps a copy, but keep ours for the process's life

/// PMIx's server is one per process, and PMIx 4.2 cannot start it again once it was finalized
/// (PMIx_server_init after PMIx_server_finalize aborts in its listener thread: the listening
/// socket is set up only the first time). So the first PmixHost starts it for the rest of the
/// process's life and every PmixHost registers and deregisters only its job: nodalrun's
/// attempts (--max-restarts) each have their own. Guarded by g_server_mutex.
std::mutex g_server_mutex;
bool g_server_started = false;
bool g_host_exists = false;
std::string g_hostname;  // the node's name for PMIx and in every job's maps

/// The node's topology for PMIx_server_init (PMIX_TOPOLOGY2), or nullptr if hwloc fails (PMIx
/// then discovers its own). Without one, PMIx_server_init discovers it with I/O objects
/// (src/hwloc/pmix_hwloc.c: HWLOC_TYPE_FILTER_KEEP_IMPORTANT), which was ~13 of the first
/// PmixHost's ~15 ms here: hwloc dlopen()s its plugins (libxml2, OpenCL, GL and X11,
/// libpciaccess), reads every PCI device's config space and walks /sys's block and net devices.
/// A one-node job's server uses none of it: in PMIx 4.2 only the pnet components (vendor checks
/// for the fabric setup a host asks for with PMIx_server_setup_application, which nodalrun does
/// not call) and device distances a client asks the server for (Open MPI 4.1 asks none) look at
/// I/O objects, and the clients discover their own topology (the server does not share its: no
/// PMIX_SERVER_SHARE_TOPOLOGY; what a client can PMIx_Get is unchanged). So: nodalrun's own
/// topology (topology.hpp; already loaded when placement bound the ranks), which PMIx keeps as
/// an "external" one for the server's life and never destroys.
pmix_topology_t* server_topology() {
  static char source[] = "hwloc";
  static pmix_topology_t topology{source, nullptr};
  try {
    topology.topology = node_topology();
  } catch (const std::runtime_error&) {
    return nullptr;
  }
  return &topology;
}

/// NAME=VALUE in this process's environment for its lifetime, unless NAME is set already (the
/// user's choice stands); then removed again.
class DefaultEnv {
 public:
  DefaultEnv(const char* name, const char* value) : name_(name), set_(std::getenv(name) == nullptr) {
    if (set_) ::setenv(name, value, 1);
  }
  ~DefaultEnv() {
    if (set_) ::unsetenv(name_);
  }
  DefaultEnv(const DefaultEnv&) = delete;
  DefaultEnv& operator=(const DefaultEnv&) = delete;
  bool applied() const { return set_; }

 private:
  const char* name_;
  bool set_;
};

void start_server(const std::string& tmpdir) {
  if (g_server_started) return;
  // Job data through the socket only (gds/hash), not in shared-memory files (gds/ds21, ds12):
  // those live in the server's tmpdir, which is fixed when the server starts, so a later job
  // whose tmpdir differs (or whose first tmpdir was removed) could not be registered, and they
  // stay behind if nodalrun is killed. Set in this process's environment, where PMIx reads its
  // MCA parameters; ranks inherit it, which is harmless (they are told PMIX_GDS_MODULE=hash).
  // The cost is startup time for large jobs: every client gets the job's data over its socket.
  ::setenv("PMIX_MCA_gds", "hash", 1);
  // The server: no tool or system rendezvous files; clients connect over TCP on the loopback
  // interface (PMIx 4 has no Unix-socket transport any more; PMIX_MCA_ptl=usock is an error).
  // The host name is given, so that the name PMIx files this node's info under (by default
  // gethostname() without its domain) is the one in the job's node map.
  g_hostname = host_name();
  InfoArray server;
  server.add_string(PMIX_HOSTNAME, g_hostname);
  server.add_u32(PMIX_NODEID, 0);
  server.add_string(PMIX_SERVER_TMPDIR, tmpdir);
  server.add_string(PMIX_SYSTEM_TMPDIR, tmpdir);
  server.add_bool(PMIX_SERVER_TOOL_SUPPORT, false);
  server.add_bool(PMIX_SERVER_SYSTEM_SUPPORT, false);
  server.add_bool(PMIX_SERVER_SESSION_SUPPORT, false);
  server.add_bool(PMIX_SERVER_REMOTE_CONNECTIONS, false);
  if (pmix_topology_t* topology = server_topology()) server.add_topology(PMIX_TOPOLOGY2, topology);
  // Not pcompress/zlib, the one MCA component PMIx_server_init dlopen()s (with libz) that this
  // server never uses, ~0.1 ms: it compresses only strings over 4096 bytes that this process
  // PMIx_Put()s (it puts none) and, in preg/compress, the maps of PMIx_generate_regex/ppn, which
  // then are PMIx's native regex (what 4.2.2 gave a 1200-rank proc map with zlib too:
  // "pmix[0-1199]"). Without a compressor PMIx's stub warns once (show_help, at the first regex;
  // its string is never freed, and LeakSanitizer sees no libpmix frame in it): silenced with it.
  // (prm/slurm, the other DSO, is as idle here but costs nothing measurable.) For the server
  // only: its MCA parameters are read here, so they are unset again, and the ranks (PMIx
  // clients, which compress long values they put) do not inherit them.
  const pmix_status_t status = [&] {
    DefaultEnv no_zlib("PMIX_MCA_pcompress", "^zlib");
    std::optional<DefaultEnv> quiet;
    if (no_zlib.applied()) quiet.emplace("PMIX_MCA_pcompress_base_silence_warning", "1");
    return PMIx_server_init(&g_module, server.data(), server.size());
  }();
  if (!ok(status)) fail("PMIx_server_init", status);
  g_server_started = true;
}

pmix_proc_t proc_of(const std::string& nspace, int rank) {
  pmix_proc_t proc;
  PMIX_PROC_CONSTRUCT(&proc);
  PMIX_LOAD_PROCID(&proc, nspace.c_str(), static_cast<pmix_rank_t>(rank));
  return proc;
}

}  // namespace

PmixHost::PmixHost(const std::string& nspace, int size, const std::string& tmpdir)
    : nspace_(nspace), size_(size), session_dir_(tmpdir + "/session"), state_(std::make_unique<State>()) {
  if (size < 1 || size > UINT16_MAX)  // local ranks are uint16_t
    throw std::runtime_error(fmt::format("PMIx job of {} ranks: 1 to {}", size, UINT16_MAX));
  if (nspace.empty() || nspace.size() > PMIX_MAX_NSLEN)
    throw std::runtime_error(fmt::format("PMIx namespace '{}': 1 to {} characters", nspace, PMIX_MAX_NSLEN));
  {
    std::lock_guard lock(g_server_mutex);
    if (g_host_exists) throw std::runtime_error("PMIx: another PmixHost exists in this process");
    start_server(tmpdir);
    g_host_exists = true;
  }
  bool registered = false;
  try {
    state_->event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (state_->event_fd < 0) throw std::runtime_error(fmt::format("eventfd: {}", std::strerror(errno)));
    // Where Open MPI puts its session directories (PMIX_TMPDIR, with "the resource manager
    // cleans them": PMIX_TDIR_RMCLEAN), so that the destructor can remove them, a killed rank's
    // included. Without it Open MPI 4.1 leaves /tmp/ompi.<host>.<uid>/jf.<n>/<n>/<rank> behind:
    // it asks the PMIx server to remove them, which PMIx 4.2 refuses without a job_control host.
    if (::mkdir(session_dir_.c_str(), 0700) != 0 && errno != EEXIST)
      throw std::runtime_error(fmt::format("mkdir {}: {}", session_dir_, std::strerror(errno)));

    // The job: one node, one app, ranks 0..size-1 in order.
    const std::string& host = g_hostname;
    const std::string peers = rank_list(size);
    const auto n = static_cast<std::uint32_t>(size);
    InfoArray job;
    job.add_u32(PMIX_UNIV_SIZE, n);
    job.add_u32(PMIX_JOB_SIZE, n);
    job.add_u32(PMIX_MAX_PROCS, n);
    job.add_string(PMIX_JOBID, nspace);
    job.add_string(PMIX_TMPDIR, session_dir_);
    job.add_bool(PMIX_TDIR_RMCLEAN, true);
    job.add_u32(PMIX_JOB_NUM_APPS, 1);
    job.add_u32(PMIX_NUM_NODES, 1);
    add_regex(job, PMIX_NODE_MAP, PMIx_generate_regex, host);
    add_regex(job, PMIX_PROC_MAP, PMIx_generate_ppn, peers);
    // This node's
    job.add_u32(PMIX_LOCAL_SIZE, n);
    job.add_u32(PMIX_NODE_SIZE, n);
    job.add_string(PMIX_LOCAL_PEERS, peers);
    job.add_rank(PMIX_LOCALLDR, 0);
    job.add_string(PMIX_HOSTNAME, host);
    job.add_u32(PMIX_NODEID, 0);
    // The app's
    job.add_u32(PMIX_APPNUM, 0);
    job.add_u32(PMIX_APP_SIZE, n);
    job.add_rank(PMIX_APPLDR, 0);
    // Each rank's (given PMIX_PROC_DATA, the library derives none of these from the maps)
    for (int rank = 0; rank < size; ++rank) {
      InfoArray proc;
      proc.add_rank(PMIX_RANK, static_cast<pmix_rank_t>(rank));  // must come first
      proc.add_u16(PMIX_LOCAL_RANK, static_cast<std::uint16_t>(rank));
      proc.add_u16(PMIX_NODE_RANK, static_cast<std::uint16_t>(rank));
      proc.add_rank(PMIX_APP_RANK, static_cast<pmix_rank_t>(rank));
      proc.add_rank(PMIX_GLOBAL_RANK, static_cast<pmix_rank_t>(rank));
      proc.add_string(PMIX_HOSTNAME, host);
      proc.add_u32(PMIX_NODEID, 0);
      proc.add_u32(PMIX_APPNUM, 0);
      proc.add_u32(PMIX_REINCARNATION, 0);
      job.add_array(PMIX_PROC_DATA, proc);
    }
    registered = true;  // a failure part way through leaves part of it registered
    pmix_status_t status = PMIx_server_register_nspace(nspace.c_str(), size, job.data(), job.size(), nullptr, nullptr);
    if (!ok(status)) fail("PMIx_server_register_nspace", status);
    for (int rank = 0; rank < size; ++rank) {
      pmix_proc_t proc = proc_of(nspace, rank);
      status = PMIx_server_register_client(&proc, ::getuid(), ::getgid(), state_.get(), nullptr, nullptr);
      if (!ok(status)) fail("PMIx_server_register_client", status);
    }
  } catch (...) {
    release(registered);
    throw;
  }
}

PmixHost::~PmixHost() { release(true); }

namespace {

/// PMIx_server_deregister_nspace, waiting at most `limit` for PMIx's thread to have done it.
/// False if it has not: the completion record is then left to PMIx.
bool deregister_within(const std::string& nspace, std::chrono::seconds limit) {
  struct Done {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;
  };
  auto* done = new Done;
  PMIx_server_deregister_nspace(
      nspace.c_str(),
      [](pmix_status_t, void* data) {
        auto* d = static_cast<Done*>(data);
        std::lock_guard lock(d->mutex);  // notified under the lock: the waiter may free it right after
        d->done = true;
        d->changed.notify_all();
      },
      done);
  std::unique_lock lock(done->mutex);
  if (!done->changed.wait_for(lock, limit, [&] { return done->done; })) return false;
  lock.unlock();
  delete done;
  return true;
}

}  // namespace

void PmixHost::release(bool registered) noexcept {
  // Deregistering waits for PMIx's thread: afterwards no callback for these clients runs, so
  // state_ can go. Clients still connected lose their server. Not when a registered client did
  // not complete its connection: in PMIx 4.2 (to 4.2.9 at least) a client that dies while the
  // server answers its connection (Open MPI's MPI_Init) makes the server's connection handler
  // release the client's record twice (ptl_base_connection_hdlr.c, its `error:` path, then the
  // peer's destructor): the record is freed while still in the namespace's list, which
  // deregistering then walks. That namespace stays registered (each attempt has its own) and
  // state_ stays for callbacks that might still name it; a wait for PMIx's thread that does not
  // end is given up too, rather than hang nodalrun's exit.
  bool released = false;
  if (registered) {
    std::size_t connected;
    {
      std::lock_guard lock(state_->mutex);
      connected = state_->connected.size();
    }
    if (connected == static_cast<std::size_t>(size_)) {
      released = deregister_within(nspace_, std::chrono::seconds(10));
      if (!released) {
        ::fprintf(stderr, "nodalrun: PMIx's thread did not release job %s within 10 s; leaving it\n", nspace_.c_str());
      }
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(session_dir_, ignored);
  if (state_->event_fd >= 0) ::close(state_->event_fd);
  state_->event_fd = -1;
  if (registered && !released) {
    static auto* kept = new std::vector<State*>;  // PMIx may still hold it: kept, and reachable
    kept->push_back(state_.release());
  }
  std::lock_guard lock(g_server_mutex);
  g_host_exists = false;
}

std::vector<std::string> PmixHost::client_environment(int rank) {
  if (rank < 0 || rank >= size_) throw std::runtime_error(fmt::format("PMIx rank {} of {}", rank, size_));
  pmix_proc_t proc = proc_of(nspace_, rank);
  char** env = nullptr;
  const pmix_status_t status = PMIx_server_setup_fork(&proc, &env);
  std::vector<std::string> out;
  if (env) {
    for (char** entry = env; *entry; ++entry) {
      out.emplace_back(*entry);
      std::free(*entry);
    }
    std::free(env);
  }
  if (!ok(status)) fail("PMIx_server_setup_fork", status);
  // Open MPI 4.1 uses a PMIx server (ess/pmi) only when its schizo framework says it was
  // launched: by mpirun (a local orted's URI), or by a resource manager it recognises from the
  // environment (SLURM_*, FLUX_JOB_ID, JSM_JSRUN_PORT). Otherwise schizo/orte declares it a
  // singleton, and ess/singleton ignores PMIX_* and forks an orted of its own: N one-rank jobs.
  // Without schizo/orte nothing declares a singleton, and ess/pmi is chosen. Other MPIs and
  // Open MPI 5 (which has no schizo in its processes) do not read the name.
  out.emplace_back("OMPI_MCA_schizo=^orte");
  return out;
}

int PmixHost::event_fd() const { return state_->event_fd; }

std::vector<PmixEvent> PmixHost::take_events() {
  std::vector<PmixEvent> out;
  std::lock_guard lock(state_->mutex);
  std::uint64_t count = 0;
  [[maybe_unused]] ssize_t got = ::read(state_->event_fd, &count, sizeof count);  // EAGAIN when none
  out.swap(state_->events);
  return out;
}

}  // namespace nodal::launcher
