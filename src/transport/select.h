// Which transport connects each pair of ranks.
//
// Every rank states, in its PeerInfo (exchanged by the bootstrap allgather
// before any connection is made), which network transports it can load and
// which transport it was asked for. The choice for a pair is then a pure
// function of the two PeerInfos and the same on both ends and on every rank:
//   MESHCCL_TRANSPORT=<name>          that transport for every pair;
//   same host                         shm (unless MESHCCL_SHM_DISABLE=1);
//   NCCL_NET / MESHCCL_NET / ncclConfig_t.netName = <name>
//                                     that transport between hosts;
//   otherwise                         the first of kNetOrder both ends can load.
// A transport asked for that some rank cannot load, or ranks asking for
// different ones, fail init on every rank with a message saying which rank
// lacks what and what it has.
//
// Network plugins are loaded only when a pair of ranks needs a network
// transport: in the exchange a rank says which plugins it has found (nothing
// is loaded), and only when the table shows ranks on different hosts (or
// MESHCCL_TRANSPORT names a network transport) does each rank load what it
// may use and the ranks agree on what loaded (agree_on_networks: one
// allgather). A one-host job loads none.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "util/status.h"

namespace meshccl {

// Network transports in order of preference.
inline constexpr const char* kNetOrder[] = {"ucx", "ofi", "socket"};

// Fills this rank's availability (plugins found, none loaded) and request
// fields of *me. net_name is the communicator's ncclConfig_t.netName ("" when
// unset).
void fill_transport_request(const std::string& net_name, PeerInfo* me);

// Whether some pair of these ranks uses a network transport: ranks on
// different hosts, shm disabled, or MESHCCL_TRANSPORT naming a network one.
bool needs_network(const std::vector<PeerInfo>& peers);

// Collective over the communicator, after the exchange: when needs_network,
// every rank loads what it may use between hosts (the transport asked for,
// else every network plugin it found) and the ranks' availability fields
// become what loaded; otherwise nothing is loaded and nothing exchanged.
Status agree_on_networks(Bootstrap& bs, std::vector<PeerInfo>* peers);

// The same fields as plain bytes, for a communicator made from another
// (ncclCommSplit, ncclCommShrink): each member sends its own request for the
// child (its config's netName, the environment now), so a child whose config
// names another network transport than its parent's gets that one.
struct TransportRequest {
  uint32_t nets;
  uint32_t scope;
  char transport[24];
};
TransportRequest transport_request(const std::string& net_name);
void apply_transport_request(const TransportRequest& req, PeerInfo* p);

// Checks that the ranks agree on the request and that every rank has it
// (loaded when a pair needs a network transport, else found).
Status check_transport_request(const std::vector<PeerInfo>& peers, int me);

// The transport between ranks a and b (see above).
std::string choose_transport(const std::vector<PeerInfo>& peers, int a, int b);

// "shm, socket, ucx": what a rank said it can load.
std::string transports_of(const PeerInfo& p);

}  // namespace meshccl
