// Which transport connects each pair of ranks.
//
// Every rank states, in its PeerInfo (exchanged by the bootstrap allgather
// before any connection is made), which transports it has, by name, with the
// scope each declares and its place in the rank's order of preference
// (registry.h), and which transport it was asked for (TransportRecord). The
// choice for a pair is then a pure function of the two PeerInfos and the same
// on both ends and on every rank:
//   MESHCCL_TRANSPORT=<name>          that transport for every pair;
//   same host                         the node-scope transport both have that
//                                     the lower rank prefers (unless
//                                     MESHCCL_SHM_DISABLE=1);
//   NCCL_NET / MESHCCL_NET / ncclConfig_t.netName = <name>
//                                     that transport between hosts;
//   otherwise                         the network-scope transport both have
//                                     that the lower rank prefers.
// A node-scope transport is never used between ranks of different machines.
// A transport asked for that some rank cannot load, or ranks asking for
// different ones, fail init on every rank with a message saying which rank
// lacks what and what it has.
//
// Plugins are loaded only when a pair of ranks needs a network transport: in
// the exchange a rank says which plugins it has found (nothing is loaded, no
// scope known), and only when the table shows ranks on different hosts (or
// MESHCCL_TRANSPORT names a transport not known to be node-scope) does each
// rank load what it may use and the ranks agree on what loaded and its scope
// (agree_on_networks: one allgather). A one-host job loads none.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "util/status.h"

namespace meshccl {

// This rank's transport record: what the registry has (plugins found, none
// loaded) and what it was asked for. net_name is the communicator's
// ncclConfig_t.netName ("" when unset). Fails when a built-in transport does
// not initialise here.
Status fill_transport_request(const std::string& net_name, PeerInfo* me);

// Whether some pair of these ranks may use a network transport: ranks on
// different hosts, shm disabled, or MESHCCL_TRANSPORT naming a transport not
// known to be node-scope.
bool needs_network(const std::vector<PeerInfo>& peers);

// Collective over the communicator, after the exchange: when needs_network,
// every rank loads what it may use between hosts (the transport asked for,
// else every plugin it found) and the ranks' records become what loaded,
// with its scope; otherwise nothing is loaded and nothing exchanged.
Status agree_on_networks(Bootstrap& bs, std::vector<PeerInfo>* peers);

// The same record, for a communicator made from another (ncclCommSplit,
// ncclCommShrink): each member sends its own for the child (its config's
// netName, the environment now), so a child whose config names another
// network transport than its parent's gets that one. apply_transport_request
// refuses a malformed record (from rank `from`).
Status transport_request(const std::string& net_name, TransportRecord* out);
Status apply_transport_request(const TransportRecord& req, int from, PeerInfo* p);

// Checks that the ranks agree on the request and that every rank has it
// (loaded when a pair needs a network transport, else found).
Status check_transport_request(const std::vector<PeerInfo>& peers, int me);

// The transport between ranks a and b (see above); "" when they have none in
// common that may connect them.
std::string choose_transport(const std::vector<PeerInfo>& peers, int a, int b);

// The scope ranks a and b agree transport `name` has: MESHCCL_SCOPE_HOST when
// either declares node scope, MESHCCL_SCOPE_NETWORK when both declare
// network scope, 0 when either does not list it or has not loaded it.
int pair_scope(const std::vector<PeerInfo>& peers, int a, int b, const std::string& name);
// Whether a transport of that scope may connect ranks a and b: a node-scope
// one only between ranks of one machine (equal machine_hash), a
// network-scope one between any two; an unknown scope never.
bool scope_allows(int scope, const PeerInfo& a, const PeerInfo& b);
// Whether the transport between ranks a and b is a node-scope one (memory
// shared within a machine): the link class, chunk sizes and the shared
// region ask this, never a transport's name.
bool node_local(const std::vector<PeerInfo>& peers, int a, int b);

// "shm, socket, ucx": what a rank said it has, in its record's order.
std::string transports_of(const PeerInfo& p);

}  // namespace meshccl
