#include "reshard/tiles.h"

#include <algorithm>

namespace meshccl::reshard {

int MeshDesc::coord(int i, int a) const {
  int stride = 1;
  for (int b = static_cast<int>(shape.size()) - 1; b > a; --b) stride *= shape[b];
  return (i / stride) % shape[a];
}

int MeshDesc::position(int rank) const {
  for (int i = 0; i < size(); ++i)
    if (ranks[i] == rank) return i;
  return -1;
}

std::string spec_str(const Spec& spec) {
  std::string out;
  for (const DimSpec& d : spec) {
    if (!out.empty()) out += ' ';
    if (d.empty()) {
      out += 'R';
      continue;
    }
    out += 'S';
    for (int a : d) out += std::to_string(a);
  }
  return out;
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? "," : "") + std::to_string(shape[d]);
  return out + "]";
}

std::string mesh_str(const MeshDesc& mesh) {
  std::string out = "(";
  for (size_t a = 0; a < mesh.shape.size(); ++a) out += (a ? "," : "") + std::to_string(mesh.shape[a]);
  return out + ")";
}

Status validate(const MeshDesc& mesh, const Spec& spec, const Shape& shape, int comm_nranks, const char* which) {
  const int nd = static_cast<int>(mesh.shape.size());
  if (nd < 1 || nd > kMaxMeshDims)
    return MC_ERROR(ncclInvalidArgument, "%s mesh has %d axes; a mesh has 1 to %d", which, nd, kMaxMeshDims);
  long long size = 1;
  for (int a = 0; a < nd; ++a) {
    if (mesh.shape[a] < 1)
      return MC_ERROR(ncclInvalidArgument, "%s mesh axis %d has size %d; every axis needs at least 1 rank", which, a,
                      mesh.shape[a]);
    size *= mesh.shape[a];
    if (size > comm_nranks)
      return MC_ERROR(ncclInvalidArgument, "%s mesh %s has more positions than the communicator's %d ranks", which,
                      mesh_str(mesh).c_str(), comm_nranks);
  }
  if (static_cast<long long>(mesh.ranks.size()) != size)
    return MC_ERROR(ncclInvalidArgument, "%s mesh %s needs %lld ranks, %zu given", which, mesh_str(mesh).c_str(), size,
                    mesh.ranks.size());
  std::vector<int> seen(comm_nranks, -1);
  for (int i = 0; i < mesh.size(); ++i) {
    const int r = mesh.ranks[i];
    if (r < 0 || r >= comm_nranks)
      return MC_ERROR(ncclInvalidArgument, "%s mesh position %d names rank %d, outside the communicator (0..%d)", which,
                      i, r, comm_nranks - 1);
    if (seen[r] >= 0)
      return MC_ERROR(ncclInvalidArgument, "%s mesh names rank %d twice (positions %d and %d)", which, r, seen[r], i);
    seen[r] = i;
  }
  if (spec.size() != shape.size())
    return MC_ERROR(ncclInvalidArgument, "%s spec has %zu dimensions but the tensor has %zu", which, spec.size(),
                    shape.size());
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxTensorDims))
    return MC_ERROR(ncclInvalidArgument, "%s tensor has %zu dimensions; 1 to %d are supported", which, shape.size(),
                    kMaxTensorDims);
  // The element count must exist: a product that wraps would pass for a small
  // tensor and every offset computed from it would be wrong.
  size_t elems = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (__builtin_mul_overflow(elems, shape[d], &elems) || elems > kMaxTensorElems)
      return MC_ERROR(ncclInvalidArgument,
                      "%s tensor of shape %s has more than 2^57 elements (no buffer can hold "
                      "it)",
                      which, shape_str(shape).c_str());
  int used_by[kMaxMeshDims] = {-1, -1, -1};
  for (size_t d = 0; d < spec.size(); ++d)
    for (int a : spec[d]) {
      if (a < 0 || a >= nd)
        return MC_ERROR(ncclInvalidArgument, "%s spec dim %zu names mesh axis %d; the %s mesh has axes 0..%d", which, d,
                        a, mesh_str(mesh).c_str(), nd - 1);
      if (used_by[a] >= 0)
        return MC_ERROR(ncclInvalidArgument, "%s spec %s uses mesh axis %d twice (tensor dims %d and %zu)", which,
                        spec_str(spec).c_str(), a, used_by[a], d);
      used_by[a] = static_cast<int>(d);
    }
  return kOk;
}

size_t Box::elems() const {
  size_t n = 1;
  for (size_t e : ext) n *= e;
  return n;
}

size_t chunk_bound(size_t len, size_t n, size_t k) {
  // floor(k * len / n) without overflow for any len below 2^63.
  return static_cast<size_t>(static_cast<unsigned __int128>(k) * len / n);
}

Layout::Layout(const MeshDesc& mesh, const Spec& spec, const Shape& shape) : mesh_(mesh), spec_(spec), shape_(shape) {
  chunks_.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    size_t n = 1;
    for (int a : spec[d]) n *= static_cast<size_t>(mesh.shape[a]);
    chunks_[d] = n;
    num_tiles_ *= n;
  }
  holders_.resize(num_tiles_);
  for (int i = 0; i < mesh.size(); ++i) holders_[tile_of(i)].push_back(i);
}

size_t Layout::chunk_of(int i, int d) const {
  size_t k = 0;
  for (int a : spec_[d]) k = k * static_cast<size_t>(mesh_.shape[a]) + static_cast<size_t>(mesh_.coord(i, a));
  return k;
}

size_t Layout::tile_of(int i) const {
  size_t t = 0;
  for (int d = 0; d < ndims(); ++d) t = t * chunks_[d] + chunk_of(i, d);
  return t;
}

Box Layout::tile_box(size_t tile) const {
  Box b;
  b.lo.resize(shape_.size());
  b.ext.resize(shape_.size());
  for (int d = ndims() - 1; d >= 0; --d) {
    const size_t k = tile % chunks_[d];
    tile /= chunks_[d];
    b.lo[d] = chunk_bound(shape_[d], chunks_[d], k);
    b.ext[d] = chunk_bound(shape_[d], chunks_[d], k + 1) - b.lo[d];
  }
  return b;
}

std::vector<Slice> make_slices(const Layout& src, const Layout& dst) {
  std::vector<Slice> out;
  const int nd = dst.ndims();
  for (size_t t = 0; t < dst.num_tiles(); ++t) {
    const Box tb = dst.tile_box(t);
    if (tb.empty()) continue;
    // Per dim, the source chunks that meet the tile and the overlap with each.
    std::vector<std::vector<size_t>> ks(nd);
    for (int d = 0; d < nd; ++d)
      for (size_t k = 0; k < src.chunks(d); ++k) {
        const size_t lo = chunk_bound(src.shape()[d], src.chunks(d), k);
        const size_t hi = chunk_bound(src.shape()[d], src.chunks(d), k + 1);
        if (std::max(lo, tb.lo[d]) < std::min(hi, tb.lo[d] + tb.ext[d])) ks[d].push_back(k);
      }
    // Cartesian product, dim 0 major.
    std::vector<size_t> idx(nd, 0);
    while (true) {
      Slice s;
      s.dst_tile = t;
      s.box.lo.resize(nd);
      s.box.ext.resize(nd);
      size_t st = 0;
      for (int d = 0; d < nd; ++d) {
        const size_t k = ks[d][idx[d]];
        st = st * src.chunks(d) + k;
        const size_t lo = chunk_bound(src.shape()[d], src.chunks(d), k);
        const size_t hi = chunk_bound(src.shape()[d], src.chunks(d), k + 1);
        const size_t a = std::max(lo, tb.lo[d]), b = std::min(hi, tb.lo[d] + tb.ext[d]);
        s.box.lo[d] = a;
        s.box.ext[d] = b - a;
      }
      s.src_tile = st;
      for (int p : src.holders(st)) s.senders.push_back(src.mesh().ranks[p]);
      for (int p : dst.holders(t)) s.receivers.push_back(dst.mesh().ranks[p]);
      out.push_back(std::move(s));
      int d = nd - 1;
      while (d >= 0 && ++idx[d] == ks[d].size()) idx[d--] = 0;
      if (d < 0) break;
    }
  }
  return out;
}

namespace {
// Elements per run and the outer dims the runs iterate over.
struct RunShape {
  size_t run = 1;
  int outer = 0;  // dims [0, outer) iterate; dims [outer, nd) are inside one run
};

RunShape run_shape(const Box& box, const Box& a, const Box& b) {
  const int nd = static_cast<int>(box.ext.size());
  RunShape rs;
  rs.outer = nd;
  // Grow the run inward-out while each inner dim is covered whole on both sides.
  for (int d = nd - 1; d >= 0; --d) {
    rs.run *= box.ext[d];
    rs.outer = d;
    if (box.ext[d] != a.ext[d] || box.ext[d] != b.ext[d]) break;
  }
  return rs;
}

size_t dense_offset(const Shape& coord, const Box& a) {
  size_t off = 0;
  for (size_t d = 0; d < coord.size(); ++d) off = off * a.ext[d] + (coord[d] - a.lo[d]);
  return off;
}
}  // namespace

size_t offset_in(const Box& box, const Box& a) { return dense_offset(box.lo, a); }

void for_each_run(const Box& box, const Box& a, const Box& b, const std::function<void(size_t, size_t, size_t)>& fn) {
  if (box.empty()) return;
  const RunShape rs = run_shape(box, a, b);
  Shape c = box.lo;
  while (true) {
    fn(dense_offset(c, a), dense_offset(c, b), rs.run);
    int d = rs.outer - 1;
    while (d >= 0 && ++c[d] == box.lo[d] + box.ext[d]) c[d] = box.lo[d], --d;
    if (d < 0) break;
  }
}

size_t run_count(const Box& box, const Box& a, const Box& b) {
  if (box.empty()) return 0;
  const RunShape rs = run_shape(box, a, b);
  size_t n = 1;
  for (int d = 0; d < rs.outer; ++d) n *= box.ext[d];
  return n;
}

}  // namespace meshccl::reshard
