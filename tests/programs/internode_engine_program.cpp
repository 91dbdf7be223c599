// The inter-node engine (launcher/src/multinode/internode_plugin.h) driven directly, as the node
// agents drive it, by the 2 processes mpirun starts (tests/integration/multinode_test.cpp).
// Usage: internode_engine_program ENGINE.so
//
// 1. Exchanges of NODAL_INTERNODE_RECV_UP_TO: each agent sends messages of several lengths
//    (lengths differ between the agents), receives up to 70000 bytes, and checks that the engine's
//    `received` is the length the peer sent and that the bytes are the peer's.
// 2. An exact NODAL_INTERNODE_RECV of 1000 bytes that gets them; then one of 100 bytes that gets
//    60: test() must fail and say so.
// Prints "agent R up_to ok N", "agent R exact ok" and "agent R exact: MESSAGE"; exits non-zero on
// any other outcome.
#include "multinode/internode_plugin.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(int agent, const std::string& what) {
  std::fprintf(stderr, "agent %d: %s\n", agent, what.c_str());
  std::exit(1);
}

std::uint8_t pattern(int agent, std::size_t length, std::size_t i) {
  return static_cast<std::uint8_t>(agent * 89 + length * 7 + i * 13);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) die(-1, "usage: internode_engine_program ENGINE.so");
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) die(-1, std::string("dlopen: ") + dlerror());
  auto entry = reinterpret_cast<const nodal_internode_ops* (*)()>(dlsym(library, "nodal_internode_plugin"));
  if (entry == nullptr) die(-1, "no nodal_internode_plugin symbol");
  const nodal_internode_ops* ops = entry();
  if (ops->abi != NODAL_INTERNODE_ABI) die(-1, "ABI " + std::to_string(ops->abi));
  char error[512] = {};
  nodal_internode* self = ops->init(error, sizeof error);
  if (self == nullptr) die(-1, error);
  const int agent = ops->rank(self);
  if (ops->size(self) != 2) die(agent, "run it as 2 processes");
  const int peer = 1 - agent;

  // Runs one exchange to its end; returns the engine's error, empty on success.
  auto run = [&](std::vector<nodal_internode_transfer>& transfers) -> std::string {
    if (ops->exchange_start(self, transfers.data(), static_cast<std::uint32_t>(transfers.size()), error, sizeof error)) {
      return error;
    }
    for (int done = 0; !done;) {
      if (ops->test(self, &done, error, sizeof error)) return error;
    }
    return {};
  };

  constexpr std::size_t kRoom = 70000;
  int exchanges = 0;
  for (std::size_t base : {0, 1, 56, 4096, 65592}) {
    const std::size_t mine = base + static_cast<std::size_t>(agent) * 3;  // the agents' lengths differ
    const std::size_t theirs = base + static_cast<std::size_t>(peer) * 3;
    std::vector<std::uint8_t> out(mine), in(kRoom, 0xee);
    for (std::size_t i = 0; i < mine; ++i) out[i] = pattern(agent, mine, i);
    std::vector<nodal_internode_transfer> transfers = {
        {peer, NODAL_INTERNODE_RECV_UP_TO, in.data(), kRoom, 12345},
        {peer, NODAL_INTERNODE_SEND, out.data(), mine, 12345},
    };
    const std::string failure = run(transfers);
    if (!failure.empty()) die(agent, "exchange of " + std::to_string(mine) + " bytes: " + failure);
    if (transfers[0].received != theirs) {
      die(agent, "received " + std::to_string(transfers[0].received) + " bytes, the peer sent " + std::to_string(theirs));
    }
    if (transfers[1].received != 0) die(agent, "a send's received is " + std::to_string(transfers[1].received));
    for (std::size_t i = 0; i < theirs; ++i) {
      if (in[i] != pattern(peer, theirs, i)) die(agent, "byte " + std::to_string(i) + " of " + std::to_string(theirs));
    }
    for (std::size_t i = theirs; i < kRoom; ++i) {
      if (in[i] != 0xee) die(agent, "byte " + std::to_string(i) + " past the " + std::to_string(theirs) + " received");
    }
    ++exchanges;
  }
  std::printf("agent %d up_to ok %d\n", agent, exchanges);

  {  // an exact receive of what the peer sends
    std::vector<std::uint8_t> out(1000, static_cast<std::uint8_t>(agent + 1)), in(1000, 0);
    std::vector<nodal_internode_transfer> transfers = {
        {peer, NODAL_INTERNODE_RECV, in.data(), in.size(), 0},
        {peer, NODAL_INTERNODE_SEND, out.data(), out.size(), 0},
    };
    const std::string failure = run(transfers);
    if (!failure.empty()) die(agent, "exact exchange of 1000 bytes: " + failure);
    if (transfers[0].received != 1000 || in[999] != peer + 1) die(agent, "exact exchange of 1000 bytes: wrong data");
    std::printf("agent %d exact ok\n", agent);
  }

  std::vector<std::uint8_t> out(60, 1), in(100, 0);
  std::vector<nodal_internode_transfer> transfers = {
      {peer, NODAL_INTERNODE_RECV, in.data(), in.size(), 0},
      {peer, NODAL_INTERNODE_SEND, out.data(), out.size(), 0},
  };
  const std::string failure = run(transfers);
  if (failure.empty()) die(agent, "an exact receive of 100 bytes took a message of 60");
  std::printf("agent %d exact: %s\n", agent, failure.c_str());
  std::fflush(stdout);
  if (ops->finalize(self, error, sizeof error)) die(agent, error);
  return 0;
}
