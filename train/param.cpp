#include "param.h"

namespace meshtrain {

size_t global_index(const ParamSpec& s, size_t local, int, int) {
  const size_t r = local / s.local_cols, c = local % s.local_cols;
  const size_t col = static_cast<size_t>(s.col_part) * s.local_cols + c;
  size_t row = 0;
  if (s.qkv) {
    // Within the slice: block row_sub, then [Q | K | V] each cut by heads.
    const size_t third = static_cast<size_t>(s.rows) / 3 / s.row_slices;
    const size_t rr = static_cast<size_t>(s.row_sub) * s.local_rows + r;
    row = (rr / third) * (s.rows / 3) + s.row_slice * third + rr % third;
  } else {
    row = (static_cast<size_t>(s.row_slice) * s.row_subs + s.row_sub) * s.local_rows + r;
  }
  return row * s.cols + col;
}

}  // namespace meshtrain
