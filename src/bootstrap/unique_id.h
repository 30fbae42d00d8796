// The 128-byte ncclUniqueId: the bootstrap root's address and a random secret.
// ncclGetUniqueId starts a root thread that gathers every rank's PeerInfo and
// hands the full table back; it serves one communicator and exits.
#pragma once

#include <cstdint>
#include <vector>

#include "bootstrap/identity.h"
#include "nccl.h"
#include "util/socket.h"
#include "util/status.h"

namespace meshccl {

constexpr uint32_t kIdMagic = 0x4d534843;  // "MSHC"
constexpr int kSecretBytes = 16;

struct IdContents {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[kSecretBytes];
  uint32_t flags;  // kIdFixedAddress: address from MESHCCL_COMM_ID, rank 0 hosts the root
  uint16_t family;
  uint16_t port;   // network order
  uint8_t addr[16];
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "id too large");
constexpr uint32_t kIdFixedAddress = 1;

Status id_create(ncclUniqueId* id);
Status id_decode(const ncclUniqueId& id, IdContents* out, SockAddr* root);
// Starts the root rendezvous thread listening at `at` (port may be 0); fills
// the bound address.
Status root_start(const SockAddr& at, const uint8_t secret[kSecretBytes], SockAddr* bound);
// The rank table the root sent, checked before any of it is used: entry r
// is rank r, with an IPv4 or IPv6 bootstrap address; host ids are cut to
// their field.
Status check_peer_table(std::vector<PeerInfo>* all, int nranks);
// Rank side of the rendezvous: sends my info, receives everyone's.
Status root_exchange(const SockAddr& root, const uint8_t secret[kSecretBytes], int nranks, int rank,
                     const PeerInfo& mine, std::vector<PeerInfo>* all, AbortFlag abort, bool fixed_address);

}  // namespace meshccl
