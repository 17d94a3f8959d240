// snip/formats/integer.h: symmetric integer element formats.
//
// INT8:  bit 7 .. 0 = two's complement integer, values used: -127 .. 127
// INT4:  bit 3 .. 0 = two's complement integer, values used: -7 .. 7
// The most negative code (0x80 = -128, 0x8 = -8) decodes to its two's
// complement value but is never produced by encode: the grid is symmetric so
// that a scale maps +amax and -amax alike (max = 2^(bits-1) - 1). No Inf, no
// NaN: encode(NaN) = 0, encode(+-Inf) = +-max; values beyond +-max saturate.
#pragma once

#include "snip/formats/element_format.h"

namespace snip::formats {

inline constexpr ElementFormat kInt8{"int8", ElementKind::kInt, 8, 0, 0, 0, false,
                                     NanEncoding::kNone};
inline constexpr ElementFormat kInt4{"int4", ElementKind::kInt, 4, 0, 0, 0, false,
                                     NanEncoding::kNone};

static_assert(kInt8.max_value() == 127.0 && kInt8.max_code() == 0x7F);
static_assert(kInt4.max_value() == 7.0 && kInt4.max_code() == 0x7);

}  // namespace snip::formats
