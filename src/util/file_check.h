// Opening files named by settings so that they serve only their purpose:
// an input the library trusts (a topology file) must be a regular file that
// nobody but this user (or root) could have written; an output (a log or
// trace) is never written through a planted symbolic link, into a FIFO or
// device, or into another user's file. See docs/security.md.
#pragma once

#include <string>

namespace meshccl {

// Opens path for reading (O_CLOEXEC); -1 with *why set when it cannot be
// opened or is refused: not a regular file, owned by a user other than this
// one or root, or writable by other users.
int open_trusted_input(const std::string& path, std::string* why);

// Opens path for writing, created 0644 or truncated; -1 with *why set when it
// cannot be opened or is refused: its last component is a symbolic link, it is
// not a regular file, or it belongs to another user.
int open_private_output(const std::string& path, std::string* why);

}  // namespace meshccl
