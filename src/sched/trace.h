// MESHCCL_TRACE=file.json: a Chrome trace (opens in Perfetto or
// chrome://tracing) of every operation the engines run and every chunk the
// links move, one track per rank (operations) and per rank and link
// direction (chunks). Written as events complete; the file is a JSON array
// closed at exit (a viewer also reads it unclosed, after a crash).
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshccl {

// True when MESHCCL_TRACE names a file (read once, at first use).
bool trace_on();
// An operation of `rank` of communicator `comm` (an id for the track name),
// from start_us to now_us().
void trace_op(uint64_t comm, int rank, const char* name, int priority, double start_us);
// Writes out what is buffered (a communicator is freed; a process may end
// with _exit, which runs no exit handlers).
void trace_flush();
// A chunk of `bytes` of a transfer of `rank` to or from `peer`.
void trace_chunk(int rank, int peer, bool send, size_t bytes, int level, uint64_t tag, double start_us);

}  // namespace meshccl
