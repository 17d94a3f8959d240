// snip/dist/broadcast_text.h: one rank's text (a JSON document) on every
// rank, checked: the precision plan rank 0 solved (method/controller.h) and
// the GEMM-times table rank 0 measured (method/gemm_calibrate.h).
#pragma once

#include <string>

#include "snip/dist/world.h"

namespace snip::dist {

/// Rank `root`'s `text` on every rank (collective; the other ranks' `text`
/// is ignored): its length and CRC-32 in one int64 broadcast, then its bytes
/// in one uint8 broadcast (CPU tensors). Throws UserError "dist: <what>
/// reached rank R damaged (CRC-32 x, rank <root> sent y)" when the bytes
/// differ from what the root sent, and std::logic_error when the announced
/// length is negative or 2 GiB or more.
std::string broadcast_text(Communicator& comm, const std::string& text, int root, const std::string& what);

}  // namespace snip::dist
