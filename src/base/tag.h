// The 64-bit tag every message of the library carries: one layout, drawn here,
// with one function per kind of user. Two messages between a pair of ranks
// match only when their tags are equal, so the fields keep every kind of
// traffic apart:
//
//   63    62 ............................ 24 23 .................... 0
//  [p2p][          sequence (39 bits)       ][    step (24 bits)     ]
//
//  collective   p2p 0, its communicator's collective sequence number
//  send/recv    p2p 1, the per-peer send (= the peer's receive) sequence number
//               (38 bits: bit 62 stays 0); a reshard takes its pairs' numbers
//               the same way
//  tagged       meshcclSendTagged/meshcclRecvTagged: p2p 1 and bit 62 set, the
//  send/recv    user's 32-bit tag in bits 61-30, bit 29 zero and the per-peer,
//               per-tag sequence number in bits 28-0 (no step: a point-to-point
//               message is one step)
//  measurement  p2p 0, bit 62 set (a collective reaches it after 2^38
//               earlier ones), the init probe's own sequence
//  notice       all ones: a failure notice; all ones but bit 0: a stalled
//               collective's probe (neither is a sequence plus step: p2p
//               operations use step 0 only)
//
// Within one operation the plan numbers its messages with step tags below
// kControlStep; from kControlStep up they carry the call-signature check, which
// so can never match data, whatever the ranks called.
#pragma once

#include <cstdint>

namespace meshccl::tag {

constexpr int kStepBits = 24;
constexpr int kSeqBits = 39;
constexpr uint64_t kP2PBit = uint64_t{1} << 63;
constexpr uint64_t kMeasureBit = uint64_t{1} << 62;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr uint32_t kControlStep = 1u << (kStepBits - 1);
constexpr uint64_t kNotice = ~uint64_t{0};
constexpr uint64_t kProbe = ~uint64_t{1};

// The tag base of the collective numbered seq on its communicator.
constexpr uint64_t collective(uint64_t seq) { return (seq & kSeqMask) << kStepBits; }
// The tag base of the seq-th point-to-point message a rank sends to a peer
// (which that peer receives as its seq-th from the rank).
constexpr uint64_t p2p(uint64_t seq) { return kP2PBit | collective(seq & (kSeqMask >> 1)); }
// The tag of the seq-th message with the user's tag `user` a rank sends to a
// peer (which that peer receives as its seq-th with that tag from the rank).
constexpr int kTaggedSeqBits = 29;
constexpr uint64_t p2p_tagged(uint32_t user, uint64_t seq) {
  return kP2PBit | kMeasureBit | (uint64_t{user} << (kTaggedSeqBits + 1)) |
         (seq & ((uint64_t{1} << kTaggedSeqBits) - 1));
}
// The tag base of the seq-th timed exchange of the init probe.
constexpr uint64_t measurement(uint64_t seq) { return kMeasureBit | ((seq & (kSeqMask >> 1)) << kStepBits); }
// The sequence number a tag base carries.
constexpr uint64_t sequence(uint64_t base) { return (base & ~kP2PBit) >> kStepBits; }

static_assert(kStepBits + kSeqBits + 1 == 64, "the fields fill the tag");
static_assert((p2p(kSeqMask) | kControlStep) != kNotice && (p2p(kSeqMask) | kControlStep) != kProbe,
              "no operation's message has a notice's or a probe's tag");
static_assert(p2p_tagged(~0u, ~uint64_t{0}) != kNotice && p2p_tagged(~0u, ~uint64_t{0}) != kProbe,
              "no tagged message has a notice's or a probe's tag");
static_assert((p2p(kSeqMask) & kMeasureBit) == 0, "untagged and tagged point-to-point tags never meet");

}  // namespace meshccl::tag
