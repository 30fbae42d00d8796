// Cross-mesh resharding, the pure part: meshes, sharding specs, tiles, their
// holders, and the slices a destination tile is made of (spec section 1.2).
// No communicator, no I/O: every function here is a function of its
// arguments, identical on every rank, and tested exhaustively.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace meshccl::reshard {

constexpr int kMaxMeshDims = 3;
constexpr int kMaxTensorDims = 8;
// The most elements a tensor may have (no process addresses more bytes).
constexpr size_t kMaxTensorElems = size_t{1} << 57;

using Shape = std::vector<size_t>;

// A logical array of communicator ranks, axis 0 major (row-major).
struct MeshDesc {
  std::vector<int> shape;  // 1-3 axes, each >= 1
  std::vector<int> ranks;  // prod(shape) distinct communicator ranks
  int size() const { return static_cast<int>(ranks.size()); }
  // Coordinate of position i along axis a.
  int coord(int i, int a) const;
  // Position of a communicator rank in the mesh, -1 when absent.
  int position(int rank) const;
};

// Per tensor dimension, the mesh axes that cut it, major first; empty = R.
using DimSpec = std::vector<int>;
using Spec = std::vector<DimSpec>;

// "S0 R S01"-style text, for messages and logs.
std::string spec_str(const Spec& spec);
std::string mesh_str(const MeshDesc& mesh);
std::string shape_str(const Shape& shape);  // "[4,1024]"

// Checks one side; `which` ("source", "destination") names it in the message.
// Also refuses a shape whose element count overflows or exceeds kMaxTensorElems.
Status validate(const MeshDesc& mesh, const Spec& spec, const Shape& shape, int comm_nranks, const char* which);

// A box of the global tensor: [lo, lo + ext) per dimension.
struct Box {
  Shape lo, ext;
  size_t elems() const;
  bool empty() const { return elems() == 0; }
};

// Start of chunk k of a dimension of length len cut into n chunks.
size_t chunk_bound(size_t len, size_t n, size_t k);

// How one side (mesh + spec) cuts the tensor.
class Layout {
 public:
  Layout(const MeshDesc& mesh, const Spec& spec, const Shape& shape);
  const MeshDesc& mesh() const { return mesh_; }
  const Shape& shape() const { return shape_; }
  int ndims() const { return static_cast<int>(shape_.size()); }
  size_t chunks(int d) const { return chunks_[d]; }
  size_t num_tiles() const { return num_tiles_; }
  // Chunk index of mesh position i along tensor dim d.
  size_t chunk_of(int i, int d) const;
  // Tile (linear index over the chunk counts, dim 0 major) of mesh position i.
  size_t tile_of(int i) const;
  Box tile_box(size_t tile) const;
  Box box_of(int pos) const { return tile_box(tile_of(pos)); }
  // Mesh positions that hold the tile (its replicas), ascending.
  const std::vector<int>& holders(size_t tile) const { return holders_[tile]; }

 private:
  MeshDesc mesh_;
  Spec spec_;
  Shape shape_;
  std::vector<size_t> chunks_;
  size_t num_tiles_ = 1;
  std::vector<std::vector<int>> holders_;
};

// One piece of a destination tile that comes from one source tile.
struct Slice {
  size_t dst_tile = 0, src_tile = 0;
  Box box;                     // global coordinates
  std::vector<int> senders;    // communicator ranks holding src_tile
  std::vector<int> receivers;  // communicator ranks needing dst_tile
};

// Every non-empty slice, destination tiles in order, then source tiles.
std::vector<Slice> make_slices(const Layout& src, const Layout& dst);

// Visits the contiguous runs that copy `box` between two dense row-major
// arrays holding the boxes a and b (both contain `box`): fn(a_off, b_off, n)
// in elements, longest runs possible, in order.
void for_each_run(const Box& box, const Box& a, const Box& b, const std::function<void(size_t, size_t, size_t)>& fn);
// The number of runs for_each_run makes.
size_t run_count(const Box& box, const Box& a, const Box& b);
// Offset of box's first element in the dense array of a, in elements.
size_t offset_in(const Box& box, const Box& a);

}  // namespace meshccl::reshard
