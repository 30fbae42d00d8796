/* The layout of ncclConfig_t and ncclUniqueId as one header sees it, so two
 * translation units built against different nccl.h files can be compared. */
#ifndef ABI_LAYOUT_H_
#define ABI_LAYOUT_H_

#include <stddef.h>

#define ABI_CONFIG_FIELDS 17

struct abi_layout {
  size_t config_size;
  size_t config_align;
  size_t unique_id_size;
  size_t offsets[ABI_CONFIG_FIELDS];
  int version_code;
  int num_results;
};

extern const char* const abi_config_field_names[ABI_CONFIG_FIELDS];

/* Defined in abi_layout_ours.c, built against meshccl's include/meshccl/nccl.h. */
void abi_layout_ours(struct abi_layout* out);

#define ABI_FILL_LAYOUT(out)                              \
  do {                                                    \
    (out)->config_size = sizeof(ncclConfig_t);            \
    (out)->config_align = _Alignof(ncclConfig_t);         \
    (out)->unique_id_size = sizeof(ncclUniqueId);         \
    size_t* o_ = (out)->offsets;                          \
    o_[0] = offsetof(ncclConfig_t, size);                 \
    o_[1] = offsetof(ncclConfig_t, magic);                \
    o_[2] = offsetof(ncclConfig_t, version);              \
    o_[3] = offsetof(ncclConfig_t, blocking);             \
    o_[4] = offsetof(ncclConfig_t, cgaClusterSize);       \
    o_[5] = offsetof(ncclConfig_t, minCTAs);              \
    o_[6] = offsetof(ncclConfig_t, maxCTAs);              \
    o_[7] = offsetof(ncclConfig_t, netName);              \
    o_[8] = offsetof(ncclConfig_t, splitShare);           \
    o_[9] = offsetof(ncclConfig_t, trafficClass);         \
    o_[10] = offsetof(ncclConfig_t, commName);            \
    o_[11] = offsetof(ncclConfig_t, collnetEnable);       \
    o_[12] = offsetof(ncclConfig_t, CTAPolicy);           \
    o_[13] = offsetof(ncclConfig_t, shrinkShare);         \
    o_[14] = offsetof(ncclConfig_t, nvlsCTAs);            \
    o_[15] = offsetof(ncclConfig_t, nChannelsPerNetPeer); \
    o_[16] = offsetof(ncclConfig_t, nvlinkCentricSched);  \
    (out)->version_code = NCCL_VERSION_CODE;              \
    (out)->num_results = (int)ncclNumResults;             \
  } while (0)

#endif
