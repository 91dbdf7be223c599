// A TCP port that is free now, for torch.distributed's env:// rendezvous (MASTER_PORT): rank 0
// binds it later, so another process could take it first (torchrun's choice has the same race).
#pragma once

namespace nodal::launcher {

enum class PortScope {
  loopback,       ///< free on 127.0.0.1 (a one-node job: every rank dials the loopback address)
  any_interface,  ///< free on every address (across nodes: the other nodes dial this host)
};

/// The port the kernel hands out for a bind to port 0. Throws std::system_error.
int free_port(PortScope scope);

}  // namespace nodal::launcher
