// A CUDA storage through a queue (gpu.hpp "Queue hand-off"): the wire names the memory (a pool
// block, or an IPC handle plus offset) and holds one in-flight reference on its BlockRecord, so
// the memory stays alive while the tensor sits in a queue; an interprocess event orders the
// consumer's stream after the producer's work. Nothing here costs more than a few atomics and
// one event record or wait once the chunk, the handle and the event are known to the consumer.
#include "block_table.hpp"
#include "common.hpp"
#include "driver.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/storage.hpp>

#include <cstring>

#include <fmt/format.h>

namespace nodal::detail::gpu {

WireTensor export_storage(const Storage& storage, cuda::Stream stream) {
  require_available("a cuda tensor in a queue");
  collect_limbo();
  if (storage.kind() != Storage::Kind::cuda || !storage.gpu_state()) {
    throw UsageError("a cuda tensor in a queue: its storage is not CUDA memory nodal knows");
  }
  const auto& state = *static_cast<const GpuState*>(storage.gpu_state().get());
  WireTensor wire;
  wire.kind = state.kind;
  wire.device = storage.device();
  if (state.kind == WireTensor::Kind::none) return wire;  // empty: no memory, no order needed
  // The event is recorded on `stream` with the storage's device current: a stream of another
  // device cannot record it (cudaEventRecord fails). The legacy and per-thread default streams
  // are per device: they name the storage's device's own.
  if (stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread) {
    int stream_device = -1;
    check(cudaStreamGetDevice(stream, &stream_device), "cudaStreamGetDevice (a cuda tensor in a queue)");
    if (stream_device != wire.device) {
      throw UsageError(fmt::format("a cuda tensor in a queue: the tensor is on cuda:{} but the current stream "
                                   "(cuda::current_stream()) belongs to cuda:{}; set a stream of cuda:{} as current "
                                   "(or the default stream, nullptr) for the put",
                                   wire.device, stream_device, wire.device));
    }
  }
  BlockRecord* record = nullptr;
  if (state.kind == WireTensor::Kind::pool) {
    wire.block = state.block;
    record = &record_of(state.block.record);
  } else {
    wire.ipc_handle = state.ipc_handle;
    wire.ipc_offset = state.ipc_offset;
    wire.ipc_bytes = storage.bytes();
    wire.ipc_record = state.ipc_record;
    record = &record_of(state.ipc_record);
  }
  // self() registers this rank in the rank table before its first reference counts anywhere.
  (void)self();
  record->in_flight.fetch_add(1, std::memory_order_acq_rel);
  try {
    // The legacy default stream (nullptr) is per device: record on the storage's device's.
    DeviceGuard guard(wire.device);
    record_event(wire.device, stream, wire);
  } catch (...) {
    record->in_flight.fetch_sub(1, std::memory_order_acq_rel);
    throw;
  }
  return wire;
}

std::shared_ptr<Storage> import_storage(const WireTensor& wire, cuda::Stream stream) {
  require_available("a cuda tensor from a queue");
  collect_limbo();
  std::shared_ptr<Storage> storage;
  try {
    switch (wire.kind) {
      case WireTensor::Kind::none:
        storage = Storage::cuda(nullptr, 0, wire.device, std::make_shared<GpuState>(), nullptr);
        break;
      case WireTensor::Kind::pool:
        storage = pool_import(wire);
        break;
      case WireTensor::Kind::ipc:
        storage = ipc_import(wire);
        break;
      default:
        throw CudaError(fmt::format("a queued cuda tensor of unknown kind {}", static_cast<int>(wire.kind)));
    }
  } catch (...) {
    release_wire(wire);
    throw;
  }
  // On failure the storage goes (dropping the reference just taken) and the slot is freed.
  DeviceGuard guard(wire.device);
  wait_event(wire, stream);
  return storage;
}

void release_wire(const WireTensor& wire) noexcept {
  release_event(wire);
  try {
    std::uint64_t offset = wire.kind == WireTensor::Kind::pool  ? wire.block.record
                           : wire.kind == WireTensor::Kind::ipc ? wire.ipc_record
                                                                : 0;
    if (offset != 0) record_of(offset).in_flight.fetch_sub(1, std::memory_order_acq_rel);
  } catch (...) {
    // a corrupt wire: nothing to give back
  }
}

}  // namespace nodal::detail::gpu
