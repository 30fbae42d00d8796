// The C entry points every transport plugin has in common, written once.
//
// A plugin describes itself with a traits struct P and gets its whole
// meshccl_transport_v1_t from Entry<P>::table(). The shims check every
// pointer the host hands back (magic values through ArgCheck), refuse NULL
// out-parameters and buffers, clear results before any work, keep C++
// exceptions from crossing the C boundary, and route test() to the send or
// receive side by the request's kind. The plugin supplies only what its
// network does differently:
//
//   static constexpr const char* kName;            "shm", "socket", ...
//   using Ctx, ListenComm, SendComm, RecvComm, Request;  each with a `magic`
//     member, Ctx with `host`, the others with `ctx`; Request with `kind`
//     (an enum with kSend) and `comm`.
//   static constexpr uint32_t kCtxMagic, kListenMagic, kSendMagic,
//     kRecvMagic, kReqMagic;
//   static ArgCheck& check();
//   static meshccl_tresult_t init(host, void** ctx);
//   static void props(Ctx*, meshccl_transport_props_v1_t*);   (device 0 only)
//   static meshccl_tresult_t listen(Ctx*, void* handle, void** lcomm);
//   static meshccl_tresult_t connect(Ctx*, const void* handle, void** scomm);
//   static meshccl_tresult_t accept(ListenComm*, void** rcomm);
//   static meshccl_tresult_t send_post(SendComm*, const void*, size_t, uint64_t tag, void** req);
//   static meshccl_tresult_t recv_post(RecvComm*, void*, size_t, uint64_t tag, void** req);
//   static meshccl_tresult_t send_test(Request*, int* done, size_t* size);
//   static meshccl_tresult_t recv_test(Request*, int* done, size_t* size);
//   static meshccl_tresult_t recv_probe(RecvComm*, uint64_t tag, int* found);
//     (the optional probe of transport.h; export Entry<P>::probe)
//   static void close_send(SendComm*);   release the network side, cancel
//   static void close_recv(RecvComm*);   requests; the shim then frees the comm
//   static void close_listen(ListenComm*);
//   static void finalize(Ctx*);         or bool: false keeps the context's memory
//                                        (the library below may still write to it)
//
// Memory registration is a no-op for every transport so far (they copy or
// read memory where it lies), so the shims answer it without the plugin.
#ifndef MESHCCL_PLUGINS_COMMON_ENTRY_H_
#define MESHCCL_PLUGINS_COMMON_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "meshccl/transport.h"
#include "plugins/common/plugin_util.h"

namespace meshccl::plugin {

template <class P>
class Entry {
  using Ctx = typename P::Ctx;
  using ListenComm = typename P::ListenComm;
  using SendComm = typename P::SendComm;
  using RecvComm = typename P::RecvComm;
  using Request = typename P::Request;

  static Ctx* ctx_of(void* p, const char* fn) { return P::check().template as<Ctx>(p, P::kCtxMagic, "context", fn); }

 public:
  static int init(const meshccl_transport_host_v1_t* host, void** ctx) {
    if (ctx == nullptr) return P::check().misuse(host, "init", "ctx is NULL");
    *ctx = nullptr;
    MPLUG_CHECK(check_host(host, P::kName));
    int r = guarded(host, P::kName, "init", [&] { return P::init(host, ctx); });
    if (r == MESHCCL_T_SUCCESS) P::check().remember(host);
    return r;
  }

  static int devices(void* ctx, int* ndev) {
    Ctx* c = ctx_of(ctx, "devices");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (ndev == nullptr) return P::check().misuse(c->host, "devices", "ndev is NULL");
    *ndev = 1;
    return MESHCCL_T_SUCCESS;
  }

  static int properties(void* ctx, int dev, meshccl_transport_props_v1_t* props) {
    Ctx* c = ctx_of(ctx, "properties");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (props == nullptr || dev != 0) return P::check().misuse(c->host, "properties", "bad device or NULL props");
    P::props(c, props);
    return MESHCCL_T_SUCCESS;
  }

  static int listen(void* ctx, int dev, void* handle, void** listen_comm) {
    Ctx* c = ctx_of(ctx, "listen");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (handle == nullptr || listen_comm == nullptr || dev != 0)
      return P::check().misuse(c->host, "listen", "bad device or NULL handle/listen_comm");
    *listen_comm = nullptr;
    return guarded(c->host, P::kName, "listen", [&] { return P::listen(c, handle, listen_comm); });
  }

  static int connect(void* ctx, int dev, const void* handle, void** send_comm) {
    Ctx* c = ctx_of(ctx, "connect");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (handle == nullptr || send_comm == nullptr || dev != 0)
      return P::check().misuse(c->host, "connect", "bad device or NULL handle/send_comm");
    *send_comm = nullptr;
    return guarded(c->host, P::kName, "connect", [&] { return P::connect(c, handle, send_comm); });
  }

  static int accept(void* listen_comm, void** recv_comm) {
    auto* lc = P::check().template as<ListenComm>(listen_comm, P::kListenMagic, "listen comm", "accept");
    if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (recv_comm == nullptr) return P::check().misuse(lc->ctx->host, "accept", "recv_comm is NULL");
    *recv_comm = nullptr;
    return guarded(lc->ctx->host, P::kName, "accept", [&] { return P::accept(lc, recv_comm); });
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
    auto* c = P::check().template as<SendComm>(send_comm, P::kSendMagic, "send comm", "isend");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (request == nullptr) return P::check().misuse(c->ctx->host, "isend", "request is NULL");
    *request = nullptr;
    if (data == nullptr && size != 0)
      return P::check().misuse(c->ctx->host, "isend", "NULL buffer with a non-zero size");
    return guarded(c->ctx->host, P::kName, "isend", [&] { return P::send_post(c, data, size, tag, request); });
  }

  static int irecv(void* recv_comm, void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
    (void)mhandle;
    auto* c = P::check().template as<RecvComm>(recv_comm, P::kRecvMagic, "recv comm", "irecv");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (request == nullptr) return P::check().misuse(c->ctx->host, "irecv", "request is NULL");
    *request = nullptr;
    if (data == nullptr && size != 0)
      return P::check().misuse(c->ctx->host, "irecv", "NULL buffer with a non-zero size");
    return guarded(c->ctx->host, P::kName, "irecv", [&] { return P::recv_post(c, data, size, tag, request); });
  }

  static int test(void* request, int* done, size_t* size) {
    auto* r = P::check().template as<Request>(request, P::kReqMagic, "request", "test");
    if (r == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (done == nullptr) return P::check().misuse(P::check().host(), "test", "done is NULL");
    if (r->kind == decltype(r->kind)::kSend) {
      auto* c = static_cast<SendComm*>(r->comm);
      return guarded(c->ctx->host, P::kName, "test", [&] { return P::send_test(r, done, size); });
    }
    auto* c = static_cast<RecvComm*>(r->comm);
    return guarded(c->ctx->host, P::kName, "test", [&] { return P::recv_test(r, done, size); });
  }

  static int probe(void* recv_comm, uint64_t tag, int* found) {
    auto* c = P::check().template as<RecvComm>(recv_comm, P::kRecvMagic, "recv comm", "probe");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    if (found == nullptr) return P::check().misuse(c->ctx->host, "probe", "found is NULL");
    *found = 0;
    return guarded(c->ctx->host, P::kName, "probe", [&] { return P::recv_probe(c, tag, found); });
  }

  static int close_send(void* send_comm) {
    auto* c = P::check().template as<SendComm>(send_comm, P::kSendMagic, "send comm", "close_send");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    P::close_send(c);
    c->magic = 0;
    delete c;
    return MESHCCL_T_SUCCESS;
  }

  static int close_recv(void* recv_comm) {
    auto* c = P::check().template as<RecvComm>(recv_comm, P::kRecvMagic, "recv comm", "close_recv");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    P::close_recv(c);
    c->magic = 0;
    delete c;
    return MESHCCL_T_SUCCESS;
  }

  static int close_listen(void* listen_comm) {
    auto* lc = P::check().template as<ListenComm>(listen_comm, P::kListenMagic, "listen comm", "close_listen");
    if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    P::close_listen(lc);
    lc->magic = 0;
    delete lc;
    return MESHCCL_T_SUCCESS;
  }

  static int finalize(void* ctx) {
    Ctx* c = ctx_of(ctx, "finalize");
    if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
    bool free_it = true;
    if constexpr (std::is_same_v<decltype(P::finalize(c)), bool>) {
      free_it = P::finalize(c);  // false: the library below still holds the context's memory
    } else {
      P::finalize(c);
    }
    P::check().forget(c->host);
    c->magic = 0;
    if (free_it) delete c;
    return MESHCCL_T_SUCCESS;
  }

  static constexpr meshccl_transport_v1_t table() {
    return meshccl_transport_v1_t{
        .name = P::kName,
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
