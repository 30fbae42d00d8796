// The transports a communicator can use: the built-in C plugins (shm, socket)
// and loadable ones (libmeshccl-transport-<name>.so), each wrapped in a small
// C++ class that turns plugin error codes into Status with a message.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshccl/transport.h"
#include "util/status.h"

namespace meshccl {

// What the transport last warned about on this thread during the latest
// send, receive or test call ("" if nothing): why that call failed.
const std::string& transport_warning();

class Transport {
 public:
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Creates the plugin context for one communicator.
  static Status open(const meshccl_transport_v1_t* api, int rank, int nranks, std::unique_ptr<Transport>* out);

  const char* name() const { return api_->name; }
  const meshccl_transport_props_v1_t& props() const { return props_; }

  Status listen(void* handle, void** listen_comm);
  Status connect(const void* handle, void** send_comm);  // *send_comm null: retry
  Status accept(void* listen_comm, void** recv_comm);    // *recv_comm null: retry
  // *request null: busy, retry later.
  Status isend(void* send_comm, const void* data, size_t size, uint64_t tag, void** request);
  Status irecv(void* recv_comm, void* data, size_t size, uint64_t tag, void** request);
  Status test(void* request, bool* done, size_t* size);
  // Whether a message with tag has arrived on recv_comm, untaken (the
  // plugin's optional probe, transport.h); ncclInvalidUsage without one.
  Status probe(void* recv_comm, uint64_t tag, bool* found);
  // Whether the plugin exports a wait descriptor (transport.h).
  bool has_wait_fd() const { return wait_fd_ != nullptr; }
  // Arms the context's wait descriptor and returns it; -1: do not block now
  // (or none).
  int wait_fd();
  void close_send(void* c);
  void close_recv(void* c);
  void close_listen(void* c);

 private:
  Transport(const meshccl_transport_v1_t* api, void* ctx) : api_(api), ctx_(ctx) {}
  Status check(int rc, const char* what) const;

  const meshccl_transport_v1_t* api_;
  meshccl_transport_v1_probe_t probe_ = nullptr;
  meshccl_transport_v1_wait_fd_t wait_fd_ = nullptr;
  void* ctx_;
  meshccl_transport_props_v1_t props_{};
  std::unique_ptr<meshccl_transport_host_v1_t> host_;
};

// The optional probe of a transport (transport.h), or null.
meshccl_transport_v1_probe_t transport_probe(const meshccl_transport_v1_t* api);
// Its optional wait descriptor (transport.h), or null.
meshccl_transport_v1_wait_fd_t transport_wait_fd(const meshccl_transport_v1_t* api);

// The registry: the built-in transports (plugins/builtin.h) and the plugins
// found on the search path (MESHCCL_PLUGIN_PATH, then relative to this
// library: <libdir>/meshccl, the build tree's plugins/, then the configured
// prefix), each known by its name. When a transport loads, the registry
// opens a context of it once, reads the scope its properties declare
// (MESHCCL_SCOPE_HOST: processes of one machine only; NETWORK: any two
// ranks) and closes it again; a transport whose init fails then does not
// load. A module is loaded once per process, in a private working directory
// and with the signal dispositions kept (plugin_guard.h); the log (INIT,
// NET) names the file and the scope.
//
// Order of preference: every plugin before every built-in transport (a
// plugin is there to do better than the built-in fallback); plugins by the
// directory they were found in (the search path's order), within one
// directory in the build's order (meson option plugin_preference), then by
// name; built-in ones in their own order.
struct TransportInfo {
  std::string name;
  std::string path;     // "built in", or the plugin's file
  std::string version;  // (transport_inventory) the plugin's description, else its interface version
  std::string problem;  // why it does not load or initialise here; "" when it does or was not tried
  int scope = 0;        // MESHCCL_SCOPE_* its properties declare; 0 until it loaded
  int preference = 0;   // its place in this process's order of preference, 0 first
  bool builtin = false;
};

// Every transport this process has, nothing loaded: the built-in ones in
// their order, then the plugins found, by preference (the first file of a
// name on the search path wins). A plugin's scope is 0 unless it loaded
// before; a built-in transport's is read at the first call.
std::vector<TransportInfo> transport_list();

// Loads a transport by name (built-in ones only have their scope read): false
// with *why set when it is neither built in nor found, does not load, or its
// init fails. A failed dlopen is remembered; a failed init is tried again at
// the next call.
bool load_transport(const std::string& name, const meshccl_transport_v1_t** out, std::string* why);
// The same as a Status (ncclInvalidUsage, logged).
Status find_transport(const std::string& name, const meshccl_transport_v1_t** out);
// Whether a transport of that name is built in or found on the search path,
// without loading it: false with *why set.
bool transport_exists(const std::string& name, std::string* why);
// The scope the transport's properties declared when it loaded
// (MESHCCL_SCOPE_*), 0 when it has not loaded.
int transport_scope(const std::string& name);
// "node" or "network" for a MESHCCL_SCOPE_* value, "unknown" otherwise.
const char* scope_name(int scope);

// Every transport found (transport_list's order), each loaded, with its
// scope and version: for meshccl_info. Plugin files whose name cannot be a
// transport's are listed with the reason.
std::vector<TransportInfo> transport_inventory();

}  // namespace meshccl
