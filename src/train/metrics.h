// src/train/metrics.h: RUN/metrics.jsonl, one JSON object per optimizer
// step (a StepRecord, snip/run/step_record.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/run/step_record.h"

namespace snip {

/// Appends one record per step to a JSON-lines file; every write is checked.
class MetricsLog {
 public:
  /// Opens `path`. resume_step < 0: a new, empty file. resume_step >= 0: keeps
  /// the records whose "step" is <= resume_step (a resumed run drops the
  /// interrupted tail and a torn last line), rewriting the file atomically,
  /// and appends after them. Throws UserError when the file cannot be opened,
  /// or, before anything is written, when what it reads back is not what snip
  /// wrote: a line that is not a JSON record (but the last, a torn write), a
  /// record step_record_from_json refuses (no integer "step", a key of
  /// another type: "PATH: line N: loss: expected a number or null, got
  /// ..."), or steps other than 1 ..
  /// resume_step in order (a record repeated or missing), naming the file
  /// and the line. A record with "rollback_to": k (the guard rolled back to
  /// step k, train/guard.h) is followed by step k + 1 again: the rolled-back
  /// records stay in the file as history, and the file is cut after the last
  /// record that leaves the run at resume_step. A missing file is a warning
  /// (its records are lost). `rollback_record`: the "rollback_record" of the
  /// checkpoint the run resumes from (a rollback's rewrite of its target,
  /// written before the record itself): when the file does not hold it as
  /// its last record at resume_step, it is put after the record of its step
  /// - 1 (a UserError when there is none).
  MetricsLog(const std::string& path, int64_t resume_step, const nlohmann::json& rollback_record = nullptr);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  /// The records kept from earlier invocations (resume), in file order,
  /// without the rolled-back ones and the rollback records themselves.
  const std::vector<StepRecord>& earlier() const { return earlier_; }

  /// Writes `record` as one line. Throws UserError naming the file and the OS
  /// error (e.g. "No space left on device") when the write fails, so a run
  /// stops instead of losing its metrics; a partly written line is cut off
  /// again, so the file holds whole records only.
  void append(const StepRecord& record);

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<StepRecord> earlier_;
};

}  // namespace snip
