// Who a rank is and where it runs, exchanged by every rank at init.
#pragma once

#include <cstdint>
#include <string>

#include "util/socket.h"

namespace meshccl {

// What a rank says about transports in the init exchange (transport/select.h):
// the ones it has, each with the scope its properties declare and its place
// in this rank's order of preference, and the one it was asked for.
// Transports are named, never numbered, so ranks need not know the same ones.
// Fixed-size, trivially copyable; check_transport_record says whether one
// received from another rank is well formed.
struct TransportRecord {
  static constexpr size_t kNameBytes = 16;  // a name (1 to 15 of a-z 0-9 _ -) and its NUL
  static constexpr size_t kEntries = 8;
  struct Entry {
    char name[kNameBytes];  // "" ends the list: every entry after it is zero too
    uint8_t scope;          // MESHCCL_SCOPE_* its properties declare; 0: found, not loaded
    uint8_t preference;     // its place in this rank's order of preference, 0 first
  };
  // What the request names (request_kind).
  static constexpr uint8_t kAutomatic = 0;
  static constexpr uint8_t kEveryPair = 1;     // MESHCCL_TRANSPORT
  static constexpr uint8_t kBetweenHosts = 2;  // NCCL_NET / MESHCCL_NET / ncclConfig_t.netName
  // Why the request cannot name a transport (request_problem).
  static constexpr uint8_t kNameOk = 0;
  static constexpr uint8_t kNameTooLong = 1;  // request holds its first 15 characters
  static constexpr uint8_t kNameBadChars = 2;

  Entry have[kEntries];      // built-in ones first, then plugins (registry order)
  char request[kNameBytes];  // the transport asked for, lower case; "" when automatic
  uint8_t request_kind;
  uint8_t request_problem;
  uint8_t pad[6];
};
static_assert(sizeof(TransportRecord) == 168, "TransportRecord is sent as bytes: its size is part of the wire format");

// Whether name is one a transport can have: 1 to 15 characters of a-z, 0-9,
// '_' and '-' (it becomes part of a file name: libmeshccl-transport-<name>.so).
bool transport_name_ok(const std::string& name);
// Whether a record another rank sent is well formed; false with *why.
bool check_transport_record(const TransportRecord& r, std::string* why);

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
  // was asked for; plugins found on the search path in the exchange, loaded
  // (their scope known) after it when a pair needs a network transport
  // (agree_on_networks).
  TransportRecord transports;
  sockaddr_storage bootstrap_addr;
};
static_assert(sizeof(PeerInfo) == 392, "PeerInfo is sent as bytes: its size is part of the wire format");

// MESHCCL_CHECKS=1 on this rank: checks apply to a communicator when any of its
// ranks asks for them, so every rank runs the same exchange.
constexpr uint32_t kPeerChecks = 1u << 0;
constexpr uint32_t kPeerFifo = 1u << 1;  // MESHCCL_PRIORITY=0 on this rank

// This process's identity (rank and bootstrap address left for the caller).
PeerInfo local_peer_info();
uint64_t hash64(const void* data, size_t size, uint64_t seed = 0x9e3779b97f4a7c15ull);

}  // namespace meshccl
