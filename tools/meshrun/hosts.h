// Hosts of an emulated cluster: the network namespaces ranks run in, and
// pinning ranks to cores. See docs/cluster.md.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

#include "options.h"

namespace meshrun {

// Where `ip netns` keeps named network namespaces.
inline constexpr const char* kNetnsDir = "/run/netns";

// The network namespaces --cluster / --hosts select, in host order; empty
// when the options name none. Returns "" or a one-line error.
std::string resolve_hosts(const Options& opt, std::vector<std::string>* names);

// Opens each namespace (close-on-exec descriptors, one per host).
std::string open_namespaces(const std::vector<std::string>& names, std::vector<int>* fds);

// In a forked child, before exec: moves the process into the network
// namespace fd and, as `ip netns exec` does, into a private mount namespace
// whose /sys shows that network namespace's devices. Only system calls.
// Returns 0, or an errno with *step naming the call that failed.
int enter_netns(int fd, const char** step);

struct Binding {
  cpu_set_t cpus;
  std::string where;  // "core 3 (cpus 3,19)"
};

// One binding per rank: --bind core gives the rank at machine-wide position
// p (Placement::slot) core p mod cores; --bind numa splits the positions into
// as many consecutive blocks as there are NUMA nodes. Uses hwloc; without it
// (built with -Dhwloc=disabled) any binding is an error.
std::string compute_bindings(Bind how, const std::vector<Placement>& placement, std::vector<Binding>* out);

}  // namespace meshrun
