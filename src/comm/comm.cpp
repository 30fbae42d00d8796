#include "comm/comm.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "meshccl.h"
#include "plugins/common/plugin_util.h"
#include "util/live_set.h"
#include "util/log.h"
#include "util/param.h"

using meshccl::Status;

Status ncclComm::check_peers(int* dead, const std::function<bool(int)>& matters) {
  for (int p = 0; p < nranks; ++p) {
    if (p == rank || !matters(p)) continue;
    const meshccl::PeerInfo& info = peers[p];
    *dead = p;
    if (info.machine_hash == peers[rank].machine_hash) {
      if (!meshccl::plugin::pid_alive(info.pid))
        return MC_ERROR(ncclRemoteError, "rank %d: peer rank %d (pid %d) has exited", rank, p, info.pid);
    } else if (bootstrap && bootstrap->peer_closed(p)) {
      return MC_ERROR(ncclRemoteError, "rank %d: lost the connection to rank %d on %s", rank, p, info.host_id);
    }
  }
  *dead = -1;
  return meshccl::kOk;
}

namespace meshccl {

namespace {
// Never destroyed: communicators may be torn down during exit.
LiveSet<ncclComm>& live_comms() {
  static auto* s = new LiveSet<ncclComm>();
  return *s;
}
}  // namespace

void comm_register(ncclComm* c) {
  static std::atomic<uint64_t> next{1};
  c->serial = next.fetch_add(1);
  live_comms().add(c);
}
void comm_unregister(ncclComm* c) { live_comms().remove(c); }
bool comm_is_live(const ncclComm* c) { return live_comms().contains(c); }
bool comm_pin(ncclComm* c, uint64_t serial) {
  return live_comms().with_live(c, [serial](ncclComm& live) {
    if (live.serial != serial) return false;
    ++live.sched.users;
    return true;
  });
}
void comm_unpin(ncclComm* c) { --c->sched.users; }

namespace {

// The meshccl part of a meshcclConfig_t (in->magic is MESHCCL_CONFIG_MAGIC):
// only what the caller's header knew about (its size).
Status parse_meshccl_config(const ncclConfig_t* in, CommConfig* out) {
  const auto* ext = reinterpret_cast<const meshcclConfig_t*>(in);
  if (in->size != sizeof(ncclConfig_t))
    return MC_ERROR(ncclInvalidArgument, "meshcclConfig_t.nccl.size = %zu: start from meshcclConfigInit", in->size);
  meshcclConfig_t cfg;
  meshcclConfigInit(&cfg);
  const size_t n = std::min(ext->size, sizeof(cfg));
  if (n < offsetof(meshcclConfig_t, timeoutSeconds))
    return MC_ERROR(ncclInvalidArgument, "meshcclConfig_t.size %zu is too small", ext->size);
  std::memcpy(reinterpret_cast<char*>(&cfg) + sizeof(ncclConfig_t),
              reinterpret_cast<const char*>(ext) + sizeof(ncclConfig_t), n - sizeof(ncclConfig_t));
  if (cfg.timeoutSeconds != NCCL_CONFIG_UNDEF_INT) {
    if (cfg.timeoutSeconds <= 0)
      return MC_ERROR(ncclInvalidArgument, "meshcclConfig_t.timeoutSeconds = %d is invalid (> 0)", cfg.timeoutSeconds);
    out->timeout_s = cfg.timeoutSeconds;
  }
  if (cfg.priority != NCCL_CONFIG_UNDEF_INT) {
    if (cfg.priority != 0 && cfg.priority != 1)
      return MC_ERROR(ncclInvalidArgument, "meshcclConfig_t.priority = %d is invalid (0 or 1)", cfg.priority);
    out->priority = cfg.priority;
    out->priority_given = true;
  }
  return kOk;
}

}  // namespace

Status parse_config(const ncclConfig_t* in, CommConfig* out, const CommConfig* inherit) {
  *out = inherit ? *inherit : CommConfig{};
  out->priority_given = false;
  if (in != nullptr) {
    if (in->magic != 0xcafebeef && in->magic != MESHCCL_CONFIG_MAGIC)
      return MC_ERROR(ncclInvalidArgument,
                      "ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER or meshcclConfigInit (magic 0x%x)",
                      in->magic);
    if (in->magic == MESHCCL_CONFIG_MAGIC) MC_TRY(parse_meshccl_config(in, out));
    // Copy only what the caller's header knew about; newer fields keep defaults.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    size_t n = in->size < sizeof(cfg) ? in->size : sizeof(cfg);
    if (n < offsetof(ncclConfig_t, blocking))
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t size %zu is too small", in->size);
    std::memcpy(&cfg, in, n);
    unsigned v = cfg.version;
    auto reset_int = [](int& f) { f = NCCL_CONFIG_UNDEF_INT; };
    if (v < NCCL_VERSION(2, 14, 0)) reset_int(cfg.blocking);
    if (v < NCCL_VERSION(2, 17, 0)) {
      reset_int(cfg.cgaClusterSize);
      reset_int(cfg.minCTAs);
      reset_int(cfg.maxCTAs);
      cfg.netName = nullptr;
    }
    if (v < NCCL_VERSION(2, 18, 0)) reset_int(cfg.splitShare);
    if (v < NCCL_VERSION(2, 25, 0)) reset_int(cfg.trafficClass);
    if (v < NCCL_VERSION(2, 27, 0)) {
      cfg.commName = nullptr;
      reset_int(cfg.collnetEnable);
      reset_int(cfg.CTAPolicy);
      reset_int(cfg.shrinkShare);
      reset_int(cfg.nvlsCTAs);
    }
    if (v < NCCL_VERSION(2, 28, 0)) {
      reset_int(cfg.nChannelsPerNetPeer);
      reset_int(cfg.nvlinkCentricSched);
    }
    auto check01 = [](int f, const char* name) -> Status {
      if (f != NCCL_CONFIG_UNDEF_INT && f != 0 && f != 1)
        return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.%s = %d is invalid (0 or 1)", name, f);
      return kOk;
    };
    MC_TRY(check01(cfg.blocking, "blocking"));
    MC_TRY(check01(cfg.splitShare, "splitShare"));
    MC_TRY(check01(cfg.collnetEnable, "collnetEnable"));
    MC_TRY(check01(cfg.shrinkShare, "shrinkShare"));
    MC_TRY(check01(cfg.nvlinkCentricSched, "nvlinkCentricSched"));
    if (cfg.cgaClusterSize != NCCL_CONFIG_UNDEF_INT && (cfg.cgaClusterSize < 0 || cfg.cgaClusterSize > 8))
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.cgaClusterSize = %d is invalid (0..8)", cfg.cgaClusterSize);
    if (cfg.minCTAs != NCCL_CONFIG_UNDEF_INT && cfg.minCTAs <= 0)
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.minCTAs = %d is invalid (> 0)", cfg.minCTAs);
    if (cfg.maxCTAs != NCCL_CONFIG_UNDEF_INT &&
        (cfg.maxCTAs <= 0 || (cfg.minCTAs != NCCL_CONFIG_UNDEF_INT && cfg.maxCTAs < cfg.minCTAs)))
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.maxCTAs = %d is invalid (> 0 and >= minCTAs)", cfg.maxCTAs);
    if (cfg.CTAPolicy != NCCL_CONFIG_UNDEF_INT && (cfg.CTAPolicy < 0 || cfg.CTAPolicy > 2))
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.CTAPolicy = %d is invalid (0..2)", cfg.CTAPolicy);
    if (cfg.nChannelsPerNetPeer != NCCL_CONFIG_UNDEF_INT &&
        (cfg.nChannelsPerNetPeer < 1 || cfg.nChannelsPerNetPeer > 64))
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.nChannelsPerNetPeer = %d is invalid (1..64)",
                      cfg.nChannelsPerNetPeer);
    if (cfg.nvlsCTAs != NCCL_CONFIG_UNDEF_INT && cfg.nvlsCTAs <= 0)
      return MC_ERROR(ncclInvalidArgument, "ncclConfig_t.nvlsCTAs = %d is invalid (> 0)", cfg.nvlsCTAs);
    if (cfg.blocking != NCCL_CONFIG_UNDEF_INT) out->blocking = cfg.blocking != 0;
    if (cfg.splitShare != NCCL_CONFIG_UNDEF_INT) out->split_share = cfg.splitShare != 0;
    if (cfg.commName != nullptr) out->name = cfg.commName;
    if (cfg.netName != nullptr) out->net_name = cfg.netName;
  }
  const char* env = param_env(Param::CommBlocking);
  if (env != nullptr && *env != '\0') out->blocking = std::atoi(env) != 0;
  return kOk;
}

}  // namespace meshccl
