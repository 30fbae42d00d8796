// The C entry points every transport plugin has in common, written once.
//
// A plugin binds its own functions, slot by slot, in one constexpr Binding
// and gets its whole meshccl_transport_v1_t from Entry<binding>::table():
//
//   constexpr char kName[] = "socket";
//   constexpr Binding<Ctx, ListenComm, SendComm, RecvComm, Request> kSocket{.name = kName, .check = &g_check,
//                             .magic = {kCtxMagic, kListenMagic, kSendMagic, kRecvMagic, kReqMagic},
//                             .init = do_init, .props = props, ..., .finalize = finalize};
//   extern "C" const meshccl_transport_v1_t meshccl_transport_socket = Entry<kSocket>::table();
//
// The shims check every pointer the host hands back (the magic values through
// ArgCheck), refuse NULL out-parameters and buffers, clear results before
// any work, keep C++ exceptions from crossing the C boundary, and route
// test() to the send or receive side by the request's kind. The plugin
// supplies only what its network does differently. Its types: Ctx has
// `magic` and `host`, the comms `magic` and `ctx`, Request `magic`, `kind`
// (an enum with kSend) and `comm`. Its functions:
//
//   init(host, void** ctx)                  props(Ctx*, props*)   (device 0 only)
//   listen(Ctx*, void* handle, void** lcomm)   connect(Ctx*, const void* handle, void** scomm)
//   accept(ListenComm*, void** rcomm)
//   send_post(SendComm*, data, size, tag, void** req)   recv_post(RecvComm*, data, size, tag, void** req)
//   send_test(Request*, int* done, size_t* size)        recv_test(Request*, int* done, size_t* size)
//   recv_probe(RecvComm*, tag, int* found)    (transport.h's optional probe: export Entry<b>::probe)
//   wait_fd(Ctx*, int* fd)   (transport.h's optional wait descriptor: export Entry<b>::wait_fd)
//   close_send(SendComm*), close_recv(RecvComm*), close_listen(ListenComm*):
//     release the network side and cancel requests; the shim frees the comm
//   finalize(Ctx*) -> bool: false keeps the context's memory (the library
//     below may still write to it); nullptr when there is nothing to do
//   .serialized = true: the shims hold Ctx::mu around every other call
//
// Memory registration is a no-op for every transport so far (they copy or
// read memory where it lies), so the shims answer it without the plugin.
#ifndef MESHCCL_PLUGINS_COMMON_ENTRY_H_
#define MESHCCL_PLUGINS_COMMON_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "meshccl/transport.h"
#include "plugins/common/plugin_util.h"

namespace meshccl::plugin {

// The magic value each of a plugin's objects carries.
struct Magics {
  uint32_t ctx, listen, send, recv, req;
};

template <class CtxT, class ListenCommT, class SendCommT, class RecvCommT, class RequestT>
struct Binding {
  using Ctx = CtxT;
  using ListenComm = ListenCommT;
  using SendComm = SendCommT;
  using RecvComm = RecvCommT;
  using Request = RequestT;
  const char* name;
  ArgCheck* check;
  Magics magic;
  meshccl_tresult_t (*init)(const meshccl_transport_host_v1_t* host, void** ctx);
  void (*props)(Ctx*, meshccl_transport_props_v1_t*);
  meshccl_tresult_t (*listen)(Ctx*, void* handle, void** listen_comm);
  meshccl_tresult_t (*connect)(Ctx*, const void* handle, void** send_comm);
  meshccl_tresult_t (*accept)(ListenComm*, void** recv_comm);
  meshccl_tresult_t (*send_post)(SendComm*, const void* data, size_t size, uint64_t tag, void** request);
  meshccl_tresult_t (*recv_post)(RecvComm*, void* data, size_t size, uint64_t tag, void** request);
  meshccl_tresult_t (*send_test)(Request*, int* done, size_t* size);
  meshccl_tresult_t (*recv_test)(Request*, int* done, size_t* size);
  meshccl_tresult_t (*recv_probe)(RecvComm*, uint64_t tag, int* found);
  meshccl_tresult_t (*wait_fd)(Ctx*, int* fd) = nullptr;
  void (*close_send)(SendComm*);
  void (*close_recv)(RecvComm*);
  void (*close_listen)(ListenComm*);
  bool (*finalize)(Ctx*);
  // Every call but init and finalize holds the context's `mu`: for a plugin
  // whose own threads progress the context too.
  bool serialized = false;
};

template <const auto& B>
class Entry {
  using Bound = std::remove_cvref_t<decltype(B)>;
  using Ctx = typename Bound::Ctx;
  using ListenComm = typename Bound::ListenComm;
  using SendComm = typename Bound::SendComm;
  using RecvComm = typename Bound::RecvComm;
  using Request = typename Bound::Request;

  static ArgCheck& chk() { return *B.check; }
  // A call into the plugin on behalf of context c: exceptions stay inside,
  // and a serialized plugin's context mutex `mu` is held throughout.
  template <class F>
  static int run(Ctx* c, const char* fn, F&& body) {
    if constexpr (B.serialized) {
      std::lock_guard<std::mutex> hold(c->mu);
      return guarded(c->host, B.name, fn, body);
    } else {
      return guarded(c->host, B.name, fn, body);
    }
  }
  static Ctx* ctx_of(void* p, const char* fn) { return chk().template as<Ctx>(p, B.magic.ctx, "context", fn); }

 public:
  static int init(const meshccl_transport_host_v1_t* host, void** ctx) {
    if (ctx == nullptr) return chk().misuse(host, "init", "ctx is NULL");
    *ctx = nullptr;
    MPLUG_CHECK(check_host(host, B.name));
    int r = guarded(host, B.name, "init", [&] { return B.init(host, ctx); });
    if (r == MESHCCL_T_SUCCESS) chk().remember(host);
    return r;
  }

  static int devices(void* ctx, int* ndev) {
    Ctx* c = ctx_of(ctx, "devices");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (ndev == nullptr) return chk().misuse(c->host, "devices", "ndev is NULL");
    *ndev = 1;
    return MESHCCL_T_SUCCESS;
  }

  static int properties(void* ctx, int dev, meshccl_transport_props_v1_t* props) {
    Ctx* c = ctx_of(ctx, "properties");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (props == nullptr || dev != 0) return chk().misuse(c->host, "properties", "bad device or NULL props");
    B.props(c, props);
    return MESHCCL_T_SUCCESS;
  }

  static int listen(void* ctx, int dev, void* handle, void** listen_comm) {
    Ctx* c = ctx_of(ctx, "listen");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (handle == nullptr || listen_comm == nullptr || dev != 0)
      return chk().misuse(c->host, "listen", "bad device or NULL handle/listen_comm");
    *listen_comm = nullptr;
    return run(c, "listen", [&] { return B.listen(c, handle, listen_comm); });
  }

  static int connect(void* ctx, int dev, const void* handle, void** send_comm) {
    Ctx* c = ctx_of(ctx, "connect");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (handle == nullptr || send_comm == nullptr || dev != 0)
      return chk().misuse(c->host, "connect", "bad device or NULL handle/send_comm");
    *send_comm = nullptr;
    return run(c, "connect", [&] { return B.connect(c, handle, send_comm); });
  }

  static int accept(void* listen_comm, void** recv_comm) {
    auto* lc = chk().template as<ListenComm>(listen_comm, B.magic.listen, "listen comm", "accept");
    if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (recv_comm == nullptr) return chk().misuse(lc->ctx->host, "accept", "recv_comm is NULL");
    *recv_comm = nullptr;
    return run(lc->ctx, "accept", [&] { return B.accept(lc, recv_comm); });
  }

  static int reg_mr(void* comm, void* data, size_t size, void** mhandle) {
    (void)comm;
    (void)data;
    (void)size;
    if (mhandle != nullptr) *mhandle = nullptr;
    return MESHCCL_T_SUCCESS;
  }

  static int dereg_mr(void* comm, void* mhandle) {
    (void)comm;
    (void)mhandle;
    return MESHCCL_T_SUCCESS;
  }

  static int isend(void* send_comm, const void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
    (void)mhandle;
    auto* c = chk().template as<SendComm>(send_comm, B.magic.send, "send comm", "isend");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (request == nullptr) return chk().misuse(c->ctx->host, "isend", "request is NULL");
    *request = nullptr;
    if (data == nullptr && size != 0) return chk().misuse(c->ctx->host, "isend", "NULL buffer with a non-zero size");
    return run(c->ctx, "isend", [&] { return B.send_post(c, data, size, tag, request); });
  }

  static int irecv(void* recv_comm, void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
    (void)mhandle;
    auto* c = chk().template as<RecvComm>(recv_comm, B.magic.recv, "recv comm", "irecv");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (request == nullptr) return chk().misuse(c->ctx->host, "irecv", "request is NULL");
    *request = nullptr;
    if (data == nullptr && size != 0) return chk().misuse(c->ctx->host, "irecv", "NULL buffer with a non-zero size");
    return run(c->ctx, "irecv", [&] { return B.recv_post(c, data, size, tag, request); });
  }

  static int test(void* request, int* done, size_t* size) {
    auto* r = chk().template as<Request>(request, B.magic.req, "request", "test");
    if (r == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (done == nullptr) return chk().misuse(chk().host(), "test", "done is NULL");
    if (r->kind == decltype(r->kind)::kSend) {
      auto* c = static_cast<SendComm*>(r->comm);
      return run(c->ctx, "test", [&] { return B.send_test(r, done, size); });
    }
    auto* c = static_cast<RecvComm*>(r->comm);
    return run(c->ctx, "test", [&] { return B.recv_test(r, done, size); });
  }

  static int probe(void* recv_comm, uint64_t tag, int* found) {
    auto* c = chk().template as<RecvComm>(recv_comm, B.magic.recv, "recv comm", "probe");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (found == nullptr) return chk().misuse(c->ctx->host, "probe", "found is NULL");
    *found = 0;
    return run(c->ctx, "probe", [&] { return B.recv_probe(c, tag, found); });
  }

  static int wait_fd(void* ctx, int* fd) {
    Ctx* c = ctx_of(ctx, "wait_fd");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (fd == nullptr) return chk().misuse(c->host, "wait_fd", "fd is NULL");
    *fd = -1;
    return run(c, "wait_fd", [&] { return B.wait_fd(c, fd); });
  }

  static int close_send(void* send_comm) {
    auto* c = chk().template as<SendComm>(send_comm, B.magic.send, "send comm", "close_send");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    (void)run(c->ctx, "close_send", [&] {
      B.close_send(c);
      return MESHCCL_T_SUCCESS;
    });
    c->magic = 0;
    delete c;
    return MESHCCL_T_SUCCESS;
  }

  static int close_recv(void* recv_comm) {
    auto* c = chk().template as<RecvComm>(recv_comm, B.magic.recv, "recv comm", "close_recv");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    (void)run(c->ctx, "close_recv", [&] {
      B.close_recv(c);
      return MESHCCL_T_SUCCESS;
    });
    c->magic = 0;
    delete c;
    return MESHCCL_T_SUCCESS;
  }

  static int close_listen(void* listen_comm) {
    auto* lc = chk().template as<ListenComm>(listen_comm, B.magic.listen, "listen comm", "close_listen");
    if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    (void)run(lc->ctx, "close_listen", [&] {
      B.close_listen(lc);
      return MESHCCL_T_SUCCESS;
    });
    lc->magic = 0;
    delete lc;
    return MESHCCL_T_SUCCESS;
  }

  static int finalize(void* ctx) {
    Ctx* c = ctx_of(ctx, "finalize");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    bool free_it = true;
    if constexpr (B.finalize != nullptr) free_it = B.finalize(c);  // false: the library below still holds it
    chk().forget(c->host);
    c->magic = 0;
    if (free_it) delete c;
    return MESHCCL_T_SUCCESS;
  }

  static constexpr meshccl_transport_v1_t table() {
    return meshccl_transport_v1_t{
        .name = B.name,
        .version = MESHCCL_TRANSPORT_V1,
        .init = init,
        .devices = devices,
        .properties = properties,
        .listen = listen,
        .connect = connect,
        .accept = accept,
        .reg_mr = reg_mr,
        .dereg_mr = dereg_mr,
        .isend = isend,
        .irecv = irecv,
        .test = test,
        .close_send = close_send,
        .close_recv = close_recv,
        .close_listen = close_listen,
        .finalize = finalize,
    };
  }
};

}  // namespace meshccl::plugin

#endif  // MESHCCL_PLUGINS_COMMON_ENTRY_H_
