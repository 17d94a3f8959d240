// The losses of a run's trajectory (session.h History).
#include "session.h"

namespace snip {

using json = nlohmann::json;

void History::replay(const std::vector<StepRecord>& records) {
  for (const StepRecord& r : records) {
    if (r.loss) add_loss(r.step, *r.loss);  // add_loss drops a non-finite loss
    if (r.val_loss && !std::isnan(*r.val_loss)) add_val(r.step, *r.val_loss);
  }
}

void History::add_loss(int64_t step, double loss) {
  if (!std::isfinite(loss)) return;
  recent_.emplace_back(step, loss);
  if (recent_.size() > 10) recent_.pop_front();
}

void History::add_val(int64_t step, double val) {
  last_val = val;
  best_val = std::min(best_val, val);
  val_hist_.emplace_back(step, val);
}

void History::rollback_to(int64_t step, double val) {
  last_val = val;
  while (!recent_.empty() && recent_.back().first > step) recent_.pop_back();
  while (!val_hist_.empty() && val_hist_.back().first > step) val_hist_.pop_back();
  best_val = std::numeric_limits<double>::infinity();
  for (const auto& [s, v] : val_hist_) best_val = std::min(best_val, v);
}

std::pair<double, int64_t> History::final_train_loss() const {
  double acc = 0;
  for (const auto& [s, l] : recent_) acc += l;
  return {recent_.empty() ? 0 : acc / double(recent_.size()), int64_t(recent_.size())};
}

}  // namespace snip
