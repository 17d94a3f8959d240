// RUN/metrics.jsonl (see metrics.h).
#include "snip/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "snip/io/atomic_file.h"
#include "snip/util/error.h"

namespace snip {

using json = nlohmann::json;

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step) : path_(path) {
  std::string kept;
  if (resume_step >= 0) {
    std::ifstream in(path);
    int64_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      const json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!r.is_object()) continue;  // a torn last line from a killed run
      // Records the run reads back (the summary's losses) must be what it wrote.
      if (!r.contains("step") || !r["step"].is_number_integer())
        fail(path, ": line ", line_no, ": step: expected an integer (the file is corrupt; a resumed run keeps "
             "the records up to its checkpoint)");
      if (r.contains("loss") && !r["loss"].is_number())
        fail(path, ": line ", line_no, ": loss: expected a number (the file is corrupt)");
      if (r.contains("val_loss") && !r["val_loss"].is_number() && !r["val_loss"].is_null())
        fail(path, ": line ", line_no, ": val_loss: expected a number or null (the file is corrupt)");
      if (r["step"].get<int64_t>() <= resume_step) {
        kept += line + "\n";
        earlier_.push_back(r);
      }
    }
  }
  io::write_file_atomic(path, kept);
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open ", path, ": ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const json& record) {
  const std::string line = record.dump() + "\n";
  const off_t start = ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "nothing written";
      if (start >= 0) (void)!::ftruncate(fd_, start);  // no torn last line
      fail("cannot write ", path_, ": ", why,
           " (the run stops here; its last checkpoint is intact, continue with --resume once fixed)");
    }
    done += size_t(n);
  }
}

}  // namespace snip
