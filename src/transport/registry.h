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
  void close_send(void* c);
  void close_recv(void* c);
  void close_listen(void* c);

 private:
  Transport(const meshccl_transport_v1_t* api, void* ctx) : api_(api), ctx_(ctx) {}
  Status check(int rc, const char* what) const;

  const meshccl_transport_v1_t* api_;
  meshccl_transport_v1_probe_t probe_ = nullptr;
  void* ctx_;
  meshccl_transport_props_v1_t props_{};
  std::unique_ptr<meshccl_transport_host_v1_t> host_;
};

// The optional probe of a transport (transport.h), or null.
meshccl_transport_v1_probe_t transport_probe(const meshccl_transport_v1_t* api);

// Finds a transport by name: built-in first, then a loadable module, the
// first found on the search path (MESHCCL_PLUGIN_PATH, then relative to this
// library: <libdir>/meshccl, the build tree's plugins/, then the configured
// prefix). A module is loaded once per process, in a private working
// directory and with the signal dispositions kept (plugin_guard.h); the log
// (INIT, NET) names the file.
Status find_transport(const std::string& name, const meshccl_transport_v1_t** out);
// The same without logging or recording an error: false with *why set.
bool load_transport(const std::string& name, const meshccl_transport_v1_t** out, std::string* why);
// Whether a transport of that name is built in or found on the search path,
// without loading it: false with *why set.
bool transport_exists(const std::string& name, std::string* why);

// Every transport found: the built-in ones and each loadable module on the
// search path (for meshccl_info). version: the plugin's own description when
// it exports meshccl_transport_v1_describe (transport.h), else its interface
// version; problem: why it does not load, "" when it does.
struct TransportInfo {
  std::string name;
  std::string path;
  std::string version;
  std::string problem;
};
std::vector<TransportInfo> transport_inventory();

}  // namespace meshccl
