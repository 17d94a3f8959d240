// RUN/metrics.jsonl (see metrics.h).
#include "snip/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "snip/io/atomic_file.h"
#include "snip/util/error.h"

namespace snip {

using json = nlohmann::json;

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step) : path_(path) {
  std::string kept;
  if (resume_step >= 0) {
    // What the resumed run keeps must be what it wrote: one record per step
    // 1 .. resume_step, in order. Only the last line may be torn (a run
    // killed while appending); records past resume_step are dropped (the
    // steps after the checkpoint run again).
    std::ifstream in(path);
    const bool exists = bool(in);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    int64_t expect = 1;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i];
      const int64_t line_no = int64_t(i) + 1;
      const json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!r.is_object()) {
        if (i + 1 == lines.size()) continue;  // a torn last line from a killed run
        fail(path, ": line ", line_no, ": not a JSON record (the file is corrupt)");
      }
      if (!r.contains("step") || !r["step"].is_number_integer())
        fail(path, ": line ", line_no, ": step: expected an integer (the file is corrupt; a resumed run keeps "
             "the records up to its checkpoint)");
      if (r.contains("loss") && !r["loss"].is_number())
        fail(path, ": line ", line_no, ": loss: expected a number (the file is corrupt)");
      if (r.contains("val_loss") && !r["val_loss"].is_number() && !r["val_loss"].is_null())
        fail(path, ": line ", line_no, ": val_loss: expected a number or null (the file is corrupt)");
      const int64_t step = r["step"].get<int64_t>();
      if (step > resume_step) continue;
      if (step != expect)
        fail(path, ": line ", line_no, ": step ", step, " where step ", expect, " was expected (a record ",
             step < expect ? "repeated" : "missing", "; the file is corrupt)");
      ++expect;
      kept += line + "\n";
      earlier_.push_back(r);
    }
    if (expect != resume_step + 1) {
      if (exists)
        fail(path, ": holds records up to step ", expect - 1, " but the run resumes at step ", resume_step,
             " (records missing; the file is corrupt)");
      spdlog::warn("{} is missing: the records of steps 1 .. {} are lost (the summary covers the resumed steps)",
                   path, resume_step);
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
