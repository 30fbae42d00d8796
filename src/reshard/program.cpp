#include "reshard/program.h"

#include <algorithm>
#include <map>
#include <set>

namespace meshccl::reshard {

namespace {

struct SliceState {
  bool have_src = false, have_dst = false;
  Ref src;                      // the packed slice on a sender
  std::vector<uint32_t> packs;  // ops that pack it
  Ref dst;                      // the packed slice on a receiver
  bool dst_scratch = false;
  std::vector<uint32_t> recvs;     // ops that fill dst
  std::map<size_t, uint32_t> got;  // element offset of a received chunk -> its op
};

class Builder {
 public:
  Builder(const Layout& src, const Layout& dst, const Schedule& s, int rank, size_t elem, size_t chunk_bytes,
          Program* p)
      : src_(src), dst_(dst), s_(s), me_(rank), elem_(elem), p_(p), state_(s.slices.size()) {
    chunk_ = std::max<size_t>(1, chunk_bytes / elem);
    spos_ = src.mesh().position(rank);
    dpos_ = dst.mesh().position(rank);
    if (spos_ >= 0) sbox_ = src.box_of(spos_);
    if (dpos_ >= 0) dbox_ = dst.box_of(dpos_);
  }

  Status build() {
    for (const LocalCopy& c : s_.copies)
      if (c.rank == me_) local_copy(c.slice);
    for (const Xfer& x : s_.xfers) MC_TRY(xfer(x));
    for (const Gather& g : s_.gathers) MC_TRY(gather(g));
    for (size_t i = 0; i < state_.size(); ++i)
      if (state_[i].have_dst && state_[i].dst_scratch) unpack(static_cast<int>(i));
    p_->send_peers.assign(send_peers_.begin(), send_peers_.end());
    p_->recv_peers.assign(recv_peers_.begin(), recv_peers_.end());
    p_->in_src = spos_ >= 0;
    p_->in_dst = dpos_ >= 0;
    p_->send_elems = spos_ >= 0 ? sbox_.elems() : 0;
    p_->recv_elems = dpos_ >= 0 ? dbox_.elems() : 0;
    return kOk;
  }

 private:
  uint32_t add(Op op) {
    p_->ops.push_back(std::move(op));
    return static_cast<uint32_t>(p_->ops.size() - 1);
  }
  // One op that completes after all of deps (a zero-byte copy at `at`), so
  // that many steps can wait on many others through one dependency.
  std::vector<uint32_t> join(const std::vector<uint32_t>& deps, Ref at) {
    if (deps.size() <= 1) return deps;
    return {add(Op{StepKind::Copy, -1, 0, at, at, 0, deps})};
  }
  size_t scratch(size_t bytes) {
    const size_t off = p_->scratch_bytes;
    p_->scratch_bytes += (bytes + 63) / 64 * 64;
    return off;
  }
  Status next_tag(int from, int to, uint32_t* tag) {
    uint32_t& t = tags_[{from, to}];
    if (t >= kControlTag)
      return MC_ERROR(ncclInvalidArgument,
                      "the plan needs more than %u messages between ranks %d and %d; raise MESHCCL_CHUNKSIZE",
                      kControlTag, from, to);
    *tag = t++;
    return kOk;
  }

  void local_copy(int i) {
    const Box& box = s_.slices[i].box;
    for_each_run(box, sbox_, dbox_, [&](size_t a, size_t b, size_t n) {
      add(Op{StepKind::Copy, -1, 0, Ref{Buf::Recv, b * elem_}, Ref{Buf::Send, a * elem_}, n * elem_, {}});
    });
  }

  // The packed source of slice i on this rank (a sender).
  SliceState& packed_src(int i) {
    SliceState& st = state_[i];
    if (st.have_src) return st;
    st.have_src = true;
    const Box& box = s_.slices[i].box;
    if (run_count(box, sbox_, box) == 1) {
      st.src = Ref{Buf::Send, offset_in(box, sbox_) * elem_};
      return st;
    }
    st.src = Ref{Buf::Scratch, scratch(box.elems() * elem_)};
    for_each_run(box, sbox_, box, [&](size_t a, size_t b, size_t n) {
      st.packs.push_back(add(Op{
          StepKind::Copy, -1, 0, Ref{Buf::Scratch, st.src.off + b * elem_}, Ref{Buf::Send, a * elem_}, n * elem_, {}}));
    });
    st.packs = join(st.packs, st.src);
    return st;
  }

  // Where slice i lands on this rank (a receiver), packed.
  SliceState& packed_dst(int i) {
    SliceState& st = state_[i];
    if (st.have_dst) return st;
    st.have_dst = true;
    const Box& box = s_.slices[i].box;
    if (run_count(box, box, dbox_) == 1) {
      st.dst = Ref{Buf::Recv, offset_in(box, dbox_) * elem_};
    } else {
      st.dst = Ref{Buf::Scratch, scratch(box.elems() * elem_)};
      st.dst_scratch = true;
    }
    return st;
  }

  static Ref at(Ref r, size_t bytes) { return Ref{r.buf, r.off + bytes}; }

  Status xfer(const Xfer& x) {
    for (size_t lo = x.lo; lo < x.hi; lo += chunk_) {
      const size_t n = std::min(chunk_, x.hi - lo);
      uint32_t prev_recv = 0;
      bool have_prev = false;
      for (size_t j = 0; j + 1 < x.chain.size(); ++j) {
        const int a = x.chain[j], b = x.chain[j + 1];
        uint32_t tag = 0;
        MC_TRY(next_tag(a, b, &tag));
        if (a == me_) {
          Op op{StepKind::Send, b, tag, Ref{}, Ref{}, n * elem_, {}};
          if (j == 0) {
            SliceState& st = packed_src(x.slice);
            op.src = at(st.src, lo * elem_);
            op.deps = st.packs;
          } else {
            op.src = at(state_[x.slice].dst, lo * elem_);
            if (have_prev) op.deps.push_back(prev_recv);
          }
          add(std::move(op));
          send_peers_.insert(b);
          p_->bytes_sent += n * elem_;
        }
        if (b == me_) {
          SliceState& st = packed_dst(x.slice);
          prev_recv = add(Op{StepKind::Recv, a, tag, at(st.dst, lo * elem_), Ref{}, n * elem_, {}});
          have_prev = true;
          st.recvs.push_back(prev_recv);
          st.got[lo] = prev_recv;
          recv_peers_.insert(a);
        }
      }
    }
    return kOk;
  }

  Status gather(const Gather& g) {
    const int k = static_cast<int>(g.group.size());
    for (int i = 0; i < k; ++i) {
      for (int m = 0; m < k; ++m) {
        if (m == i) continue;
        const int a = g.group[i], b = g.group[m];
        for (size_t lo = g.cuts[i]; lo < g.cuts[i + 1]; lo += chunk_) {
          const size_t n = std::min(chunk_, g.cuts[i + 1] - lo);
          uint32_t tag = 0;
          MC_TRY(next_tag(a, b, &tag));
          if (a == me_) {
            SliceState& st = state_[g.slice];
            Op op{StepKind::Send, b, tag, Ref{}, at(st.dst, lo * elem_), n * elem_, {}};
            // The part came in chunks of the same cut: wait for the one that holds it.
            auto it = st.got.upper_bound(lo);
            if (it != st.got.begin()) op.deps.push_back(std::prev(it)->second);
            add(std::move(op));
            send_peers_.insert(b);
            p_->bytes_sent += n * elem_;
          }
          if (b == me_) {
            SliceState& st = packed_dst(g.slice);
            st.recvs.push_back(add(Op{StepKind::Recv, a, tag, at(st.dst, lo * elem_), Ref{}, n * elem_, {}}));
            recv_peers_.insert(a);
          }
        }
      }
    }
    return kOk;
  }

  void unpack(int i) {
    SliceState& st = state_[i];
    const Box& box = s_.slices[i].box;
    const std::vector<uint32_t> all = join(st.recvs, st.dst);
    for_each_run(box, box, dbox_, [&](size_t a, size_t b, size_t n) {
      add(Op{StepKind::Copy, -1, 0, Ref{Buf::Recv, b * elem_}, at(st.dst, a * elem_), n * elem_, all});
    });
  }

  const Layout& src_;
  const Layout& dst_;
  const Schedule& s_;
  int me_;
  size_t elem_;
  Program* p_;
  std::vector<SliceState> state_;
  size_t chunk_ = 1;
  int spos_ = -1, dpos_ = -1;
  Box sbox_, dbox_;
  std::map<std::pair<int, int>, uint32_t> tags_;
  std::set<int> send_peers_, recv_peers_;
};

}  // namespace

Status make_program(const Layout& src, const Layout& dst, const Schedule& s, int rank, size_t elem, size_t chunk_bytes,
                    Program* out) {
  *out = Program{};
  Builder b(src, dst, s, rank, elem, chunk_bytes, out);
  return b.build();
}

void instantiate(const Program& p, const void* sendbuf, void* recvbuf, Plan* plan) {
  char* scratch = p.scratch_bytes > 0 ? static_cast<char*>(plan->scratch(p.scratch_bytes)) : nullptr;
  auto addr = [&](Ref r) -> char* {
    switch (r.buf) {
      case Buf::Send: return const_cast<char*>(static_cast<const char*>(sendbuf)) + r.off;
      case Buf::Recv: return static_cast<char*>(recvbuf) + r.off;
      case Buf::Scratch: return scratch + r.off;
    }
    return nullptr;
  };
  for (const Op& op : p.ops) {
    Plan::StepId id;
    switch (op.kind) {
      case StepKind::Send: id = plan->send(op.peer, op.tag, addr(op.src), op.bytes); break;
      case StepKind::Recv: id = plan->recv(op.peer, op.tag, addr(op.dst), op.bytes); break;
      default: id = plan->copy(addr(op.dst), addr(op.src), op.bytes); break;
    }
    for (uint32_t d : op.deps) plan->add_dep(id, d);
  }
}

}  // namespace meshccl::reshard
