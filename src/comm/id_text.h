// The text of an id file of meshcclCommInitFromEnv: "meshccl-id 1 <n> <hex>",
// where n counts the job's communicators and hex is the 128-byte id. The
// file comes from disk, so its parser takes any bytes.
#pragma once

#include <string>

#include "nccl.h"

namespace meshccl {

std::string id_text(unsigned long generation, const ncclUniqueId& id);
// False unless text is exactly an id file's (a trailing newline allowed).
bool parse_id_text(const std::string& text, unsigned long* generation, ncclUniqueId* id);

}  // namespace meshccl
