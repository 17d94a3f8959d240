// snip/train/metrics.h: RUN/metrics.jsonl, one JSON object per optimizer
// step (the keys are listed in train/trainer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace snip {

/// Appends one record per step to a JSON-lines file; every write is checked.
class MetricsLog {
 public:
  /// Opens `path`. resume_step < 0: a new, empty file. resume_step >= 0: keeps
  /// the records whose "step" is <= resume_step (a resumed run drops the
  /// interrupted tail and a torn last line), rewriting the file atomically,
  /// and appends after them. Throws UserError when the file cannot be opened,
  /// or, before anything is written, when a complete line read back is not a
  /// record snip writes ("step" an integer, "loss" a number, "val_loss" a
  /// number or null), naming the file and the line number.
  MetricsLog(const std::string& path, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  /// The records kept from earlier invocations (resume), in file order.
  const std::vector<nlohmann::json>& earlier() const { return earlier_; }

  /// Writes `record` as one line. Throws UserError naming the file and the OS
  /// error (e.g. "No space left on device") when the write fails, so a run
  /// stops instead of losing its metrics; a partly written line is cut off
  /// again, so the file holds whole records only.
  void append(const nlohmann::json& record);

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<nlohmann::json> earlier_;
};

}  // namespace snip
