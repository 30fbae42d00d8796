// One rank's part of a schedule: the steps it runs, with buffers named
// relative to its send buffer, receive buffer and scratch, built once per plan
// and turned into a sched Plan at every execution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "reshard/schedule.h"
#include "sched/plan.h"

namespace meshccl::reshard {

enum class Buf : uint8_t { Send, Recv, Scratch };
struct Ref {
  Buf buf = Buf::Send;
  size_t off = 0;  // bytes
};

struct Op {
  StepKind kind = StepKind::Copy;  // Send, Recv or Copy
  int peer = -1;
  uint32_t tag = 0;
  Ref dst, src;
  size_t bytes = 0;
  std::vector<uint32_t> deps;  // earlier ops
};

struct Program {
  std::vector<Op> ops;
  size_t scratch_bytes = 0;
  std::vector<int> send_peers, recv_peers;  // ranks this one sends to / receives from, ascending
  size_t send_elems = 0, recv_elems = 0;    // this rank's source and destination tiles
  bool in_src = false, in_dst = false;
  size_t bytes_sent = 0;  // to other ranks, per execution
};

// Program of `rank`; every rank numbers the messages of each pair alike.
// Fails when one pair would carry more messages than step tags allow.
Status make_program(const Layout& src, const Layout& dst, const Schedule& s, int rank, size_t elem, size_t chunk_bytes,
                    Program* out);

// The Plan for one execution: buffers bound, steps in program order.
void instantiate(const Program& p, const void* sendbuf, void* recvbuf, Plan* plan);

}  // namespace meshccl::reshard
