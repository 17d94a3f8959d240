// One rank's text on every rank (snip/dist/broadcast_text.h).
#include "snip/dist/broadcast_text.h"

#include <torch/torch.h>

#include <cstring>

#include "snip/core/error.h"
#include "snip/run/checkpoint_files.h"

namespace snip::dist {

std::string broadcast_text(Communicator& comm, const std::string& text, int root, const std::string& what) {
  const bool me = comm.rank() == root;
  torch::Tensor head = torch::tensor({me ? int64_t(text.size()) : int64_t{0}, me ? int64_t(crc32_of(text)) : int64_t{0}},
                                     torch::kLong);
  comm.broadcast(head, root);
  const int64_t n = head[0].item<int64_t>();
  const uint32_t crc = uint32_t(head[1].item<int64_t>());
  SNIP_CHECK(n >= 0 && n < (int64_t{1} << 31), what, ": rank ", root, " announced ", n, " bytes");
  std::string bytes = me ? text : std::string();
  if (n > 0) {
    torch::Tensor buf = torch::zeros({n}, torch::kUInt8);
    if (me) std::memcpy(buf.data_ptr<uint8_t>(), text.data(), size_t(n));
    comm.broadcast(buf, root);
    if (!me) bytes.assign(reinterpret_cast<const char*>(buf.data_ptr<uint8_t>()), size_t(n));
  }
  if (crc32_of(bytes) != crc)
    fail("dist: ", what, " reached rank ", comm.rank(), " damaged (CRC-32 ", crc32_of(bytes), ", rank ", root,
         " sent ", crc, ")");
  return bytes;
}

}  // namespace snip::dist
