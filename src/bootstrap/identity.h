// Who a rank is and where it runs, exchanged by every rank at init.
#pragma once

#include <cstdint>
#include <string>

#include "util/socket.h"

namespace meshccl {

// Fixed-size, trivially copyable: sent as bytes through the bootstrap.
struct PeerInfo {
  int32_t rank;
  int32_t pid;
  int32_t cuda_dev;
  uint32_t flags;         // kPeer* settings this rank brings to the communicator
  uint64_t host_hash;     // equal = same (possibly emulated) host: MESHCCL_HOSTID, else machine + network namespace
  uint64_t machine_hash;  // equal = same kernel and pid namespace: pids are comparable
  char host_id[64];       // for logs
  // Transport selection (transport/select.h): what this rank has and what it
  // was asked for. Bit i: kNetOrder[i], bit 31: the requested one; found on
  // the search path in the exchange, loaded after it when a pair needs a
  // network transport (agree_on_networks).
  uint32_t nets;
  uint32_t transport_scope;  // 0 automatic, 1 every pair (MESHCCL_TRANSPORT), 2 between hosts (NCCL_NET, netName)
  char transport[24];        // requested transport, lower case
  sockaddr_storage bootstrap_addr;
};

// MESHCCL_CHECKS=1 on this rank: checks apply to a communicator when any of its
// ranks asks for them, so every rank runs the same exchange.
constexpr uint32_t kPeerChecks = 1u << 0;
constexpr uint32_t kPeerFifo = 1u << 1;  // MESHCCL_PRIORITY=0 on this rank

// This process's identity (rank and bootstrap address left for the caller).
PeerInfo local_peer_info();
uint64_t hash64(const void* data, size_t size, uint64_t seed = 0x9e3779b97f4a7c15ull);

}  // namespace meshccl
