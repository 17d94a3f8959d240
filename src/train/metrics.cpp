// RUN/metrics.jsonl (see metrics.h).
#include "metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace snip {

using json = nlohmann::json;

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step, const json& rollback_record) : path_(path) {
  std::string kept;
  if (resume_step >= 0) {
    // What the resumed run keeps must be what it wrote: one record per step
    // 1 .. resume_step, in order, where a record with "rollback_to": k (the
    // guard rolled back, train/guard.h) is followed by step k + 1 again. Only
    // the last line may be torn (a run killed while appending); records past
    // resume_step in the last stretch are dropped (the steps after the
    // checkpoint run again). The rolled-back stretches stay (history).
    std::ifstream in(path);
    const bool exists = bool(in);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    struct Rec {
      std::string line;
      json r;
      StepRecord typed;
      int64_t at;  // the step the run is at after this record (rollback_to for a rollback)
    };
    std::vector<Rec> recs;
    int64_t expect = 1;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i];
      const int64_t line_no = int64_t(i) + 1;
      json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!r.is_object()) {
        if (i + 1 == lines.size()) continue;  // a torn last line from a killed run
        fail(path, ": line ", line_no, ": not a JSON record (the file is corrupt)");
      }
      StepRecord typed;
      try {
        typed = step_record_from_json(r, path + ": line " + std::to_string(line_no));
      } catch (const UserError& e) {
        fail(e.what(), " (the file is corrupt; a resumed run keeps the records up to its checkpoint)");
      }
      const int64_t step = typed.step;
      if (step != expect) {
        fail(path, ": line ", line_no, ": step ", step, " where step ", expect, " was expected (a record ",
             step < expect ? "repeated" : "missing", "; the file is corrupt)");
      }
      int64_t at = step;
      if (typed.rollback_to) {
        if (*typed.rollback_to < 0 || *typed.rollback_to >= step)
          fail(path, ": line ", line_no, ": rollback_to: expected a step below ", step, " (the file is corrupt)");
        at = *typed.rollback_to;
      }
      expect = at + 1;
      recs.push_back({line, std::move(r), std::move(typed), at});
    }
    // Keep up to the last record after which the run was at resume_step.
    int64_t last = -1;
    for (size_t i = 0; i < recs.size(); ++i)
      if (recs[i].at == resume_step) last = int64_t(i);
    // A checkpoint the guard's rollback rewrote carries the rollback's record
    // (step s, "rollback_to": resume_step), appended only after the rewrite:
    // when it is not the last record that leaves the run at resume_step, the
    // run was killed in between, and the record joins the file after the
    // stretch's step s - 1, as the uninterrupted run wrote it.
    if (rollback_record.is_object() && rollback_record.value("rollback_to", int64_t{-1}) == resume_step &&
        rollback_record.contains("step") && rollback_record["step"].is_number_integer()) {
      const int64_t s = rollback_record["step"].get<int64_t>();
      const bool there = last >= 0 && recs[size_t(last)].r == rollback_record;
      if (!there) {
        int64_t before = -1;  // the last record after which the run was at step s - 1
        for (size_t i = 0; i < recs.size(); ++i)
          if (recs[i].at == s - 1) before = int64_t(i);
        if (before < 0)
          fail(path, ": holds no record of step ", s - 1, ", before the rollback at step ", s, " that the checkpoint "
               "of step ", resume_step, " records (records missing; the file is corrupt)");
        recs.resize(size_t(before) + 1);
        recs.push_back({rollback_record.dump(), rollback_record,
                        step_record_from_json(rollback_record, "the checkpoint's rollback_record"), resume_step});
        last = int64_t(recs.size()) - 1;
        spdlog::info("{}: the rollback record of step {} was not written before the run stopped: written now", path, s);
      }
    }
    if (resume_step > 0 && last < 0) {
      if (exists && !recs.empty())
        fail(path, ": holds no record of step ", resume_step, " (the run resumes there; records missing, the file "
             "is corrupt)");
      spdlog::warn("{} is missing: the records of steps 1 .. {} are lost (the summary covers the resumed steps)",
                   path, resume_step);
    }
    for (int64_t i = 0; i <= last; ++i) {
      kept += recs[size_t(i)].line + "\n";
      // earlier(): the trajectory that leads to the checkpoint (rolled-back
      // steps left out).
      while (!earlier_.empty() && earlier_.back().step > recs[size_t(i)].at) earlier_.pop_back();
      if (!recs[size_t(i)].typed.rollback_to) earlier_.push_back(recs[size_t(i)].typed);
    }
  }
  io::write_file_atomic(path, kept);
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open ", path, ": ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const StepRecord& record) {
  const std::string line = record.to_json().dump() + "\n";
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
