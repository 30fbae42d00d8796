#include "collectives/rank_math.h"

#include <algorithm>
#include <bit>

namespace meshccl {

TreeLinks binary_tree(int n, int rank) {
  TreeLinks t;
  if (n <= 1) return t;
  int bit = 1;
  while (bit < n && (rank & bit) == 0) bit <<= 1;
  if (rank == 0) {  // bit is the first power of two >= n
    t.child[0] = bit >> 1;
    return t;
  }
  t.parent = (rank ^ bit) | (bit << 1);
  if (t.parent >= n) t.parent = rank ^ bit;
  int low = bit >> 1;
  if (low == 0) return t;  // odd ranks are leaves
  t.child[0] = rank - low;
  while (low > 0 && rank + low >= n) low >>= 1;
  if (low > 0) t.child[1] = rank + low;
  return t;
}

namespace {
int map_rank(int r, int n, bool mirror) { return r < 0 ? -1 : (mirror ? n - 1 - r : (r + 1) % n); }
}  // namespace

TreeLinks double_tree(int n, int rank, int t) {
  if (t == 0) return binary_tree(n, rank);
  const bool mirror = n % 2 == 0;
  const int pos = mirror ? n - 1 - rank : (rank - 1 + n) % n;
  TreeLinks b = binary_tree(n, pos);
  TreeLinks out;
  out.parent = map_rank(b.parent, n, mirror);
  out.child[0] = map_rank(b.child[0], n, mirror);
  out.child[1] = map_rank(b.child[1], n, mirror);
  return out;
}

TreeLinks rooted_double_tree(int n, int root, int rank, int t) {
  TreeLinks out;
  if (n <= 1) return out;
  const int m = n - 1;  // ranks below the root, indexed 0..m-1 from root+1
  auto real = [&](int idx) { return idx < 0 ? -1 : (root + 1 + idx) % n; };
  if (rank == root) {
    // The root of the sub-tree: the index whose parent is -1.
    int top = 0;
    if (t == 1 && m > 1) top = m % 2 == 0 ? m - 1 : 1;
    out.child[0] = real(top);
    return out;
  }
  const int idx = (rank - root - 1 + n) % n;
  TreeLinks b = double_tree(m, idx, t);
  out.parent = b.parent < 0 ? root : real(b.parent);
  out.child[0] = real(b.child[0]);
  out.child[1] = real(b.child[1]);
  return out;
}

int binary_tree_depth(int n) { return n <= 1 ? 0 : static_cast<int>(std::bit_width(static_cast<unsigned>(n - 1))); }

int rooted_tree_depth(int n) { return n <= 1 ? 0 : 1 + binary_tree_depth(n - 1); }

int hd_pof2(int n) { return n <= 1 ? 1 : static_cast<int>(std::bit_floor(static_cast<unsigned>(n))); }

int hd_newrank(int n, int rank) {
  const int rem = n - hd_pof2(n);
  if (rank < 2 * rem) return rank % 2 == 0 ? -1 : rank / 2;
  return rank - rem;
}

int hd_rank_of(int n, int newrank) {
  const int rem = n - hd_pof2(n);
  return newrank < rem ? 2 * newrank + 1 : newrank + rem;
}

int hd_first(int n, int newrank) {
  const int rem = n - hd_pof2(n);
  return newrank < rem ? 2 * newrank : newrank + rem;
}

namespace {
TreeLoad load_of(int n, int depth, TreeLinks (*links)(int, int, int)) {
  TreeLoad l;
  l.depth = depth;
  for (int r = 0; r < n; ++r) {
    int up = 0, kids = 0;
    for (int t = 0; t < 2; ++t) {
      const TreeLinks k = links(n, r, t);
      up += k.parent >= 0;
      kids += k.nchildren();
    }
    l.links = std::max(l.links, up + kids);
    l.children = std::max(l.children, kids);
  }
  return l;
}

TreeLinks rooted_at_0(int n, int rank, int t) { return rooted_double_tree(n, 0, rank, t); }

}  // namespace

TreeLoad double_tree_load(int n) { return load_of(n, binary_tree_depth(n), double_tree); }
TreeLoad rooted_double_tree_load(int n) { return load_of(n, rooted_tree_depth(n), rooted_at_0); }

HostGroups host_groups(const std::vector<int>& host_id) {
  HostGroups g;
  std::vector<int> ids;
  for (size_t p = 0; p < host_id.size(); ++p) {
    size_t h = 0;
    while (h < ids.size() && ids[h] != host_id[p]) ++h;
    if (h == ids.size()) {
      ids.push_back(host_id[p]);
      g.members.emplace_back();
    }
    g.host.push_back(static_cast<int>(h));
    g.local.push_back(static_cast<int>(g.members[h].size()));
    g.members[h].push_back(static_cast<int>(p));
    g.widest = std::max(g.widest, static_cast<int>(g.members[h].size()));
  }
  return g;
}

}  // namespace meshccl
