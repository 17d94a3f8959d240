// snip/method/nonfinite.h: the error a stats step throws when its
// statistics are not finite (method/stats.h), so that the training step can
// hand it to the guard (train/guard.h "nonfinite") instead of ending the run.
#pragma once

#include "snip/core/error.h"

namespace snip {

/// A UserError whose cause is a non-finite loss, activation or gradient met
/// by a stats step ("stats step s: layer 'x' option 'fp4': expected finite
/// statistics, got nan ...").
class NonFiniteStatsError : public UserError {
 public:
  using UserError::UserError;
};

}  // namespace snip
