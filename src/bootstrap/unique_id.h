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
  uint16_t port;  // network order
  uint8_t addr[16];
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "id too large");
constexpr uint32_t kIdFixedAddress = 1;

Status id_create(ncclUniqueId* id);
Status id_decode(const ncclUniqueId& id, IdContents* out, SockAddr* root);
// Starts the root rendezvous thread listening at `at` (port may be 0); fills
// the bound address. fixed_address: `at` came from MESHCCL_COMM_ID (a port
// that is taken is then named as such).
Status root_start(const SockAddr& at, const uint8_t secret[kSecretBytes], SockAddr* bound, bool fixed_address);
// The rank table the root sent, checked before any of it is used: entry r
// is rank r, with an IPv4 or IPv6 bootstrap address and a well-formed
// transport record (check_transport_record); host ids are cut to their field.
Status check_peer_table(std::vector<PeerInfo>* all, int nranks);
// Rank side of the rendezvous: the rank and the root each prove they hold the
// secret (HMAC-SHA256 over fresh nonces of both; the secret itself never
// crosses the wire), then the rank sends its info and receives everyone's,
// sealed with the secret, and the communicator's key: derived from the
// secret and a random value the root draws for this communicator, so that
// no two communicators share one (see docs/security.md).
Status root_exchange(const SockAddr& root, const uint8_t secret[kSecretBytes], int nranks, int rank,
                     const PeerInfo& mine, std::vector<PeerInfo>* all, uint8_t key[kSecretBytes], AbortFlag abort,
                     bool fixed_address);

// A child communicator's key (ncclCommSplit, ncclCommShrink): HMAC-SHA256 of
// the parent's key over a label and two numbers every member knows.
void derive_key(const uint8_t parent[kSecretBytes], const char* label, uint64_t a, uint64_t b,
                uint8_t out[kSecretBytes]);
// The communicator's id in logs and file names: the same on every rank,
// telling nothing about the key.
uint64_t key_id(const uint8_t key[kSecretBytes]);

}  // namespace meshccl
