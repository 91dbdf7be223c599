// The Python module nodal_torch: importing it registers the "nodal" backend with
// torch.distributed (Backend.register_backend, extended API: the creator learns the group's global
// ranks, which a subgroup needs), so that `dist.init_process_group("nodal")` and
// `dist.new_group(ranks, backend="nodal")` make ProcessGroupNodal. Also nodal_torch.empty_shared
// and the arena allocator (use_arena_allocator, stop_arena_allocator, arena_allocator_stats).
#include <nodal/torch/arena_allocator.hpp>
#include <nodal/torch/arena_tensor.hpp>
#include <nodal/torch/process_group_nodal.hpp>

#include <torch/python.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;
using nodal::torch_backend::ProcessGroupNodal;

namespace {

/// Backend.register_backend's creator with extended_api=True: `options` is torch's
/// _DistributedBackendOptions (store, group_rank, group_size, timeout, group_id,
/// global_ranks_in_group); `pg_options` is unused.
c10::intrusive_ptr<ProcessGroupNodal> create(const py::object& options, const py::object& /*pg_options*/) {
  const int group_rank = options.attr("group_rank").cast<int>();
  const int group_size = options.attr("group_size").cast<int>();
  const auto global_ranks = options.attr("global_ranks_in_group").cast<std::vector<std::int64_t>>();
  const auto group_id = options.attr("group_id").cast<std::string>();
  py::gil_scoped_release no_gil;  // joining the job may wait on nodalrun
  return ProcessGroupNodal::create(group_rank, group_size, global_ranks, group_id);
}

}  // namespace

PYBIND11_MODULE(nodal_torch, m) {
  m.doc() = "nodal's collectives as a torch.distributed backend: import nodal_torch, then "
            "torch.distributed.init_process_group('nodal') in ranks started by nodalrun";
  auto dist = py::module_::import("torch.distributed");
  py::class_<ProcessGroupNodal, nodal::torch_backend::BackendBase, c10::intrusive_ptr<ProcessGroupNodal>>(
      m, "ProcessGroupNodal")
      .def("name", &ProcessGroupNodal::getBackendName)
      .def("algorithm", [](const ProcessGroupNodal& pg) { return pg.communicator().last_algorithm(); },
           "The algorithm nodal's last call took (\"small\", \"pipelined\", \"in_place\", \"cma\").");
  m.def("_create", &create, py::arg("options"), py::arg("pg_options"));
  m.def(
      "empty_shared",
      [](const std::vector<std::int64_t>& sizes, py::object dtype) {
        const auto type = torch::python::detail::py_object_to_dtype(dtype);
        py::gil_scoped_release no_gil;
        return nodal::torch_backend::empty_shared(sizes, type);
      },
      py::arg("size"), py::arg("dtype"),
      "An uninitialised CPU tensor in nodal's job arena, which nodal's collectives read and write in place.");
  m.def(
      "use_arena_allocator",
      [](std::size_t min_bytes) {
        py::gil_scoped_release no_gil;
        nodal::torch_backend::use_arena_allocator(min_bytes);
      },
      py::arg("min_bytes") = nodal::torch_backend::kArenaAllocatorMinBytes,
      "From now on, CPU tensors of min_bytes or more are allocated in nodal's job arena (DDP's gradient "
      "buckets among them, when called before DDP is made), so nodal's collectives reduce them in place.");
  m.def("stop_arena_allocator", &nodal::torch_backend::stop_arena_allocator,
        "From now on no tensor goes to the arena (torch's own allocator gets every allocation); tensors "
        "already there stay.");
  m.def(
      "arena_allocator_stats",
      [] {
        const auto s = nodal::torch_backend::arena_allocator_stats();
        py::dict d;
        d["installed"] = s.installed;
        d["min_bytes"] = s.min_bytes;
        d["live_bytes"] = s.live_bytes;
        d["fallbacks"] = s.fallbacks;
        return d;
      },
      "This process's arena allocator: installed, min_bytes, live_bytes (bytes of its tensors now in the "
      "arena), fallbacks (allocations the arena had no room for).");
  auto backend = dist.attr("Backend");
  if (!py::hasattr(backend, "NODAL")) {
#if TORCH_VERSION_MAJOR > 1
    // torch >= 2 asks which devices a backend serves (else it warns and assumes cpu and cuda).
    backend.attr("register_backend")("nodal", m.attr("_create"), py::arg("extended_api") = true,
                                     py::arg("devices") = std::vector<std::string>{"cpu"});
#else
    backend.attr("register_backend")("nodal", m.attr("_create"), py::arg("extended_api") = true);
#endif
  }
}
