// meshccl extensions: cross-mesh resharding. The plan is worked out once
// (src/reshard: tiles, solver, schedule, this rank's program); each reshard
// turns the program into a sched Plan whose messages carry each pair's
// point-to-point sequence, and launches it like any operation.
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "base/tag.h"
#include "api/export.h"
#include "api/group.h"
#include "api/validate.h"
#include "meshccl.h"
#include "reshard/program.h"
#include "reshard/schedule.h"
#include "sched/engine.h"
#include "sched/stream.h"
#include "util/log.h"
#include "util/param.h"

using namespace meshccl;
using namespace meshccl::reshard;

struct meshcclReshardPlan {
  ncclComm* comm = nullptr;
  ncclDataType_t dtype = ncclFloat32;
  Program program;
  meshcclReshardInfo_t info{};
};

namespace {

std::mutex plans_mu;
std::set<const meshcclReshardPlan*>& live_plans() {
  static std::set<const meshcclReshardPlan*> s;
  return s;
}

// fn: the entry point whose arguments these are (it opens every message).
Status to_mesh(const char* fn, const char* which, const meshcclMesh_t* in, MeshDesc* out) {
  if (in == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : %s mesh is NULL", fn, which);
  if (in->ndims < 1 || in->ndims > MESHCCL_MESH_MAX_DIMS)
    return MC_ERROR(ncclInvalidArgument, "%s : %s mesh has %d axes; a mesh has 1 to %d", fn, which, in->ndims,
                    MESHCCL_MESH_MAX_DIMS);
  out->shape.assign(in->shape, in->shape + in->ndims);
  long long n = 1;
  for (int a = 0; a < in->ndims; ++a) {
    if (in->shape[a] < 1 || in->shape[a] > 1 << 20)
      return MC_ERROR(ncclInvalidArgument, "%s : %s mesh axis %d has size %d", fn, which, a, in->shape[a]);
    n *= in->shape[a];
  }
  if (n > 1 << 20) return MC_ERROR(ncclInvalidArgument, "%s : %s mesh is too large", fn, which);
  if (in->ranks == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : %s mesh ranks is NULL", fn, which);
  out->ranks.assign(in->ranks, in->ranks + n);
  return kOk;
}

Status to_spec(const char* fn, const char* which, const meshcclShardSpec_t* in, Spec* out) {
  if (in == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : %s spec is NULL", fn, which);
  if (in->ndims < 1 || in->ndims > MESHCCL_TENSOR_MAX_DIMS)
    return MC_ERROR(ncclInvalidArgument, "%s : %s spec has %d dimensions; 1 to %d are supported", fn, which, in->ndims,
                    MESHCCL_TENSOR_MAX_DIMS);
  out->assign(in->ndims, {});
  for (int d = 0; d < in->ndims; ++d) {
    const meshcclShardDim_t& sd = in->dims[d];
    if (sd.naxes < 0 || sd.naxes > MESHCCL_MESH_MAX_DIMS)
      return MC_ERROR(ncclInvalidArgument, "%s : %s spec dim %d has %d axes", fn, which, d, sd.naxes);
    (*out)[d].assign(sd.axes, sd.axes + sd.naxes);
  }
  return kOk;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}
uint64_t hash_side(uint64_t h, const MeshDesc& m, const Spec& s) {
  for (int x : m.shape) h = mix(h, static_cast<uint64_t>(x));
  for (int r : m.ranks) h = mix(h, static_cast<uint64_t>(r));
  for (const DimSpec& d : s) {
    h = mix(h, 0xabcdull + d.size());
    for (int a : d) h = mix(h, static_cast<uint64_t>(a));
  }
  return h;
}

// Everything this rank checks alone; fills the converted arguments.
Status check_local(const meshcclMesh_t* srcMesh, const meshcclShardSpec_t* srcSpec, const meshcclMesh_t* dstMesh,
                   const meshcclShardSpec_t* dstSpec, const size_t* shape, ncclDataType_t dtype, ncclComm* comm,
                   const meshcclReshardConfig_t* config, MeshDesc* sm, Spec* ss, MeshDesc* dm, Spec* ds, Shape* sh) {
  ncclDataType_t checked;
  MC_TRY(check_dtype("meshcclReshardPlanCreate", enum_bits(dtype), &checked));
  const char* fn = "meshcclReshardPlanCreate";
  MC_TRY(to_mesh(fn, "source", srcMesh, sm));
  MC_TRY(to_mesh(fn, "destination", dstMesh, dm));
  MC_TRY(to_spec(fn, "source", srcSpec, ss));
  MC_TRY(to_spec(fn, "destination", dstSpec, ds));
  if (ss->size() != ds->size())
    return MC_ERROR(ncclInvalidArgument,
                    "meshcclReshardPlanCreate : the source spec has %zu dimensions and the destination spec %zu",
                    ss->size(), ds->size());
  if (shape == nullptr) return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanCreate : shape is NULL");
  sh->assign(shape, shape + ss->size());
  for (size_t d = 0; d < sh->size(); ++d)
    if ((*sh)[d] > (size_t{1} << 48))
      return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanCreate : shape[%zu] = %zu is too large", d, (*sh)[d]);
  if (config != nullptr) {
    const int strategy = enum_bits(config->strategy), balance = enum_bits(config->balance);
    if (strategy < meshcclReshardAuto || strategy > meshcclReshardBroadcast)
      return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanCreate : unknown strategy %d", strategy);
    if (balance < meshcclReshardBalanceNone || balance > meshcclReshardBalanceOrder)
      return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanCreate : unknown balance mode %d", balance);
  }
  MC_TRY(validate(*sm, *ss, *sh, comm->nranks, "meshcclReshardPlanCreate : source"));
  MC_TRY(validate(*dm, *ds, *sh, comm->nranks, "meshcclReshardPlanCreate : destination"));
  size_t elems = 1;
  for (size_t x : *sh) elems *= x;  // cannot wrap: validate bounds the product
  if (elems > kMaxTensorElems / dtype_size(checked))
    return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanCreate : a tensor of shape %s holds more than 2^57 bytes",
                    shape_str(*sh).c_str());
  return kOk;
}

}  // namespace

MESHCCL_EXPORT ncclResult_t meshcclReshardPlanCreate(const meshcclMesh_t* srcMesh, const meshcclShardSpec_t* srcSpec,
                                                     const meshcclMesh_t* dstMesh, const meshcclShardSpec_t* dstSpec,
                                                     const size_t* shape, ncclDataType_t datatype, ncclComm_t comm,
                                                     const meshcclReshardConfig_t* config, meshcclReshardPlan_t* plan) {
  const ncclResult_t r = api_guard("meshcclReshardPlanCreate", [&]() -> Status {
    MC_TRY(check_comm("meshcclReshardPlanCreate", comm));
    if (plan == nullptr) return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanCreate : plan is NULL");
    *plan = nullptr;
    if (in_group()) return MC_ERROR(ncclInvalidUsage, "meshcclReshardPlanCreate : not allowed inside a group");
    MeshDesc sm, dm;
    Spec ss, ds;
    Shape sh;
    Status local =
        check_local(srcMesh, srcSpec, dstMesh, dstSpec, shape, datatype, comm, config, &sm, &ss, &dm, &ds, &sh);
    const std::string why = local.ok() ? std::string() : thread_last_error();
    const meshcclReshardConfig_t cfg =
        config != nullptr ? *config : meshcclReshardConfig_t MESHCCL_RESHARD_CONFIG_INITIALIZER;
    // Agreement: every rank learns whether any rank refused its arguments or
    // passed different ones, so all fail alike.
    uint64_t h = 0;
    if (local.ok()) {
      h = hash_side(hash_side(0x51ed, sm, ss), dm, ds);
      for (size_t x : sh) h = mix(h, x);
      h = mix(mix(mix(h, static_cast<uint64_t>(datatype)), static_cast<uint64_t>(cfg.strategy)),
              static_cast<uint64_t>(cfg.balance));
      h &= (uint64_t{1} << 62) - 1;
    }
    int64_t agree[3] = {local.ok() ? 0 : 1, static_cast<int64_t>(h), -static_cast<int64_t>(h)};
    const ncclResult_t ar = ncclAllReduce(agree, agree, 3, ncclInt64, ncclMax, comm, nullptr);
    if (ar != ncclSuccess)
      return MC_ERROR(ar, "meshcclReshardPlanCreate : agreeing on the arguments failed: %s", ncclGetLastError(comm));
    if (!local.ok()) return MC_ERROR(local.code(), "%s", why.c_str());
    if (agree[0] != 0)
      return MC_ERROR(ncclInvalidArgument,
                      "meshcclReshardPlanCreate : another rank refused its arguments (its message names the problem)");
    if (agree[1] != -agree[2])
      return MC_ERROR(ncclInvalidUsage,
                      "meshcclReshardPlanCreate : ranks passed different meshes, specs, shape, datatype or config");

    auto p = std::make_unique<meshcclReshardPlan>();
    p->comm = comm;
    p->dtype = datatype;
    const Layout src(sm, ss, sh), dst(dm, ds, sh);
    Placement pl;
    for (const RankPlace& rp : comm->topo.ranks) pl.host.push_back(rp.host);
    pl.shm = comm->tune.shm;
    pl.net = comm->tune.net;
    if (pl.shm.bw_gbs <= 0) pl.shm.bw_gbs = kNominalNumaGbs;
    if (pl.net.bw_gbs <= 0) pl.net.bw_gbs = kNominalNetGbs;
    const size_t elem = dtype_size(datatype);
    const Balance bal = static_cast<Balance>(cfg.balance);
    if (comm->settings.chunk_bytes != 0) pl.chunk_bytes = comm->settings.chunk_bytes;
    const Schedule sched = choose_schedule(src, dst, pl, elem, static_cast<Strategy>(cfg.strategy), bal);
    MC_TRY(make_program(src, dst, sched, comm->rank, elem, pl.chunk_bytes, &p->program));
    meshcclReshardInfo_t& info = p->info;
    info.strategy = static_cast<meshcclReshardStrategy_t>(sched.strategy);
    info.sendCount = p->program.send_elems;
    info.recvCount = p->program.recv_elems;
    info.bytesSent = p->program.bytes_sent;
    info.bytesNetwork = sched.net_bytes;
    info.predictedUs = sched.predicted_us;
    info.linkUs = sched.link_us;
    info.lowerBoundUs = lower_bound_us(src, dst, pl, elem);
    info.netGBs = pl.net.bw_gbs;
    info.shmGBs = pl.shm.bw_gbs;
    MC_INFO(kColl, "reshard plan %s %s -> %s %s: %s, %zu slices, %zu steps here, predicted %.1f us, bound %.1f us",
            mesh_str(sm).c_str(), spec_str(ss).c_str(), mesh_str(dm).c_str(), spec_str(ds).c_str(),
            strategy_name(sched.strategy), sched.slices.size(), p->program.ops.size(), info.predictedUs,
            info.lowerBoundUs);
    {
      std::lock_guard<std::mutex> lk(plans_mu);
      live_plans().insert(p.get());
    }
    *plan = p.release();
    return kOk;
  });
  if (r != ncclSuccess && comm_is_live(comm)) note_comm_error(comm, r);  // ncclGetLastError(comm) tells
  return r;
}

namespace {
Status check_plan(const char* fn, const meshcclReshardPlan* plan) {
  std::lock_guard<std::mutex> lk(plans_mu);
  if (plan == nullptr || live_plans().count(plan) == 0)
    return MC_ERROR(ncclInvalidArgument, "%s : plan %p is not a live reshard plan", fn, static_cast<const void*>(plan));
  return kOk;
}
}  // namespace

MESHCCL_EXPORT ncclResult_t meshcclReshard(meshcclReshardPlan_t plan, const void* sendbuf, void* recvbuf,
                                           cudaStream_t stream) {
  ncclComm* comm_of = nullptr;
  const ncclResult_t r = api_guard("meshcclReshard", [&]() -> Status {
    MC_TRY(check_plan("meshcclReshard", plan));
    ncclComm* comm = comm_of = plan->comm;
    MC_TRY(check_comm("meshcclReshard", comm));
    const Program& prog = plan->program;
    if (prog.ops.empty()) return kOk;  // in neither mesh, or nothing to move
    if (in_group()) return MC_ERROR(ncclInvalidUsage, "meshcclReshard : not allowed inside a group");
    if (prog.in_src && prog.send_elems > 0 && sendbuf == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclReshard : sendbuf is NULL on a rank of the source mesh");
    if (prog.in_dst && prog.recv_elems > 0 && recvbuf == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclReshard : recvbuf is NULL on a rank of the destination mesh");
    meshcclStream* s = nullptr;
    MC_TRY(resolve_stream("meshcclReshard", stream, &s));
    auto p = std::make_unique<Plan>();
    p->kind = OpKind::Send;
    p->algorithm = std::string("reshard_") + strategy_name(static_cast<Strategy>(plan->info.strategy));
    p->dtype = plan->dtype;
    p->send_tag_base.assign(comm->nranks, 0);
    p->recv_tag_base.assign(comm->nranks, 0);
    for (int peer : prog.send_peers) p->send_tag_base[peer] = comm->p2p_seq.send_tag(peer, false, 0);
    for (int peer : prog.recv_peers) p->recv_tag_base[peer] = comm->p2p_seq.recv_tag(peer, false, 0);
    instantiate(prog, sendbuf, recvbuf, p.get());
    return launch_run(&comm->sched, s, make_plan_run(std::move(p), tag::kP2PBit));
  });
  if (r != ncclSuccess && comm_of != nullptr && comm_is_live(comm_of)) note_comm_error(comm_of, r);
  return r;
}

MESHCCL_EXPORT ncclResult_t meshcclReshardPlanDestroy(meshcclReshardPlan_t plan) {
  return api_guard("meshcclReshardPlanDestroy", [&]() -> Status {
    if (plan == nullptr) return kOk;
    MC_TRY(check_plan("meshcclReshardPlanDestroy", plan));
    {
      std::lock_guard<std::mutex> lk(plans_mu);
      live_plans().erase(plan);
    }
    delete plan;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t meshcclReshardPlanGetInfo(meshcclReshardPlan_t plan, meshcclReshardInfo_t* info) {
  return api_guard("meshcclReshardPlanGetInfo", [&]() -> Status {
    MC_TRY(check_plan("meshcclReshardPlanGetInfo", plan));
    if (info == nullptr) return MC_ERROR(ncclInvalidArgument, "meshcclReshardPlanGetInfo : info is NULL");
    *info = plan->info;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t meshcclShardTile(const meshcclMesh_t* mesh, const meshcclShardSpec_t* spec,
                                             const size_t* shape, int rank, size_t* offset, size_t* extent) {
  return api_guard("meshcclShardTile", [&]() -> Status {
    MeshDesc m;
    Spec s;
    MC_TRY(to_mesh("meshcclShardTile", "the", mesh, &m));
    MC_TRY(to_spec("meshcclShardTile", "the", spec, &s));
    if (shape == nullptr || offset == nullptr || extent == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclShardTile : shape, offset or extent is NULL");
    const Shape sh(shape, shape + s.size());
    int maxr = 0;
    for (int r : m.ranks) maxr = std::max(maxr, r + 1);
    MC_TRY(validate(m, s, sh, std::max(maxr, m.size()), "meshcclShardTile : the"));
    const int pos = m.position(rank);
    if (pos < 0) return MC_ERROR(ncclInvalidArgument, "meshcclShardTile : rank %d is not in the mesh", rank);
    const Box b = Layout(m, s, sh).box_of(pos);
    for (size_t d = 0; d < sh.size(); ++d) offset[d] = b.lo[d], extent[d] = b.ext[d];
    return kOk;
  });
}
