// Who talks to whom: trees and halving-doubling partners as pure functions of
// (nranks, rank), with no I/O, so every rank derives the same structure and the
// tests can check it exhaustively.
#pragma once

#include <vector>

namespace meshccl {

struct TreeLinks {
  int parent = -1;          // -1 at the root
  int child[2] = {-1, -1};  // -1 where absent
  int nchildren() const { return (child[0] >= 0) + (child[1] >= 0); }
};

// NCCL's binary tree over ranks 0..n-1, in order: rank 0 is the root with a
// single child, odd ranks are leaves, and a rank whose lowest set bit is b has
// children rank -/+ b/2 (the upper one clipped to the rank count).
TreeLinks binary_tree(int n, int rank);

// Tree t (0 or 1) of NCCL's double binary tree: tree 0 is binary_tree, tree 1
// its mirror image (even n) or the same tree shifted by one rank (odd n), so
// most ranks are leaves in one of the two trees.
TreeLinks double_tree(int n, int rank, int t);

// Tree t of a double binary tree hanging below `root`: the other n-1 ranks
// form a double binary tree whose two roots are children of `root` (for
// collectives with a root: broadcast, reduce). Ranks are real ranks.
TreeLinks rooted_double_tree(int n, int root, int rank, int t);

// Edges from the deepest rank to the root.
int binary_tree_depth(int n);  // of binary_tree / double_tree
int rooted_tree_depth(int n);  // of rooted_double_tree

// How much the busiest rank does in a double binary tree, counted in
// transfers of half the data (each tree carries one half).
struct TreeLoad {
  int depth = 0;     // edges from the deepest rank to the root
  int links = 0;     // parent + children, both trees: halves sent (and received) by AllReduce
  int children = 0;  // children, both trees: halves received (and reduced) from below
};
TreeLoad double_tree_load(int n);         // double_tree: AllReduce
TreeLoad rooted_double_tree_load(int n);  // rooted_double_tree: Broadcast, Reduce

// Recursive halving-doubling runs over the largest power of two p2 <= n.
// The first 2*(n-p2) ranks pair up: the even rank of each pair folds its
// data into the odd one and sits out; every other rank gets a new rank in
// [0, p2). New rank i stands for the old ranks [hd_first(n, i), hd_first(n, i+1)).
int hd_pof2(int n);
int hd_newrank(int n, int rank);     // -1 for a rank that sits out
int hd_rank_of(int n, int newrank);  // the old rank working as newrank
int hd_first(int n, int newrank);    // first old rank newrank stands for; hd_first(n, p2) == n

// Hierarchical algorithms: the ranks of a group by host. Hosts are numbered
// in order of their lowest position, positions ascend within a host.
struct HostGroups {
  std::vector<std::vector<int>> members;  // positions on each host
  std::vector<int> host;                  // host of each position
  std::vector<int> local;                 // index of each position on its host
  int widest = 0;                         // most positions on one host
};
// host_id[p]: any id of the host of position p (equal ids, same host).
HostGroups host_groups(const std::vector<int>& host_id);
// The local index, on a host of local_size ranks, of the rank that owns share
// j of `shares` (shares = the widest host's size): contiguous runs of shares,
// every local rank owning at least one when local_size <= shares.
inline int share_owner(int local_size, int shares, int j) {
  return static_cast<int>(static_cast<long long>(j) * local_size / shares);
}

}  // namespace meshccl
