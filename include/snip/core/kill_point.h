// snip/core/kill_point.h: test-only fault injection by SIGKILL at named
// points of the program (tests/cli/kill_resume.py, tests/cli/rollback_crash.py).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace snip {

/// When the environment variable SNIP_TEST_KILL equals `point` (and, when
/// SNIP_TEST_KILL_RANK is set, the environment's RANK equals it: torchrun's
/// rank, "0" when unset), this process sends itself SIGKILL, as kill -9
/// would: nothing is flushed, no destructor runs. The points, N a step count:
///   "step@N"              during step N: its forward and backward done, the
///                         optimizer update not yet applied
///   "writing@N"           checkpoint step-N half written (step-N.tmp holds
///                         model.safetensors only)
///   "shard-written@N"     ZeRO: this rank's optimizer shard of step-N written
///                         into step-N.tmp, the ranks not yet agreed on it
///   "before-marker@N"     step-N in place, last_good.json not yet naming it
///   "after-checkpoint@N"  step-N complete, step N+1's metrics.jsonl line not
///                         yet written
///   "stats@N"             the stats step at step N, after its first pass
///   "plan@N"              the plan at step N, before the solver runs
///   "rewrite-writing", "rewrite-aside", "rewrite-before-record": the guard's
///                         rollback rewriting its target (train/trainer.cpp)
inline void test_kill_point(const std::string& point) {
  const char* k = std::getenv("SNIP_TEST_KILL");
  if (!k || point != k) return;
  if (const char* want = std::getenv("SNIP_TEST_KILL_RANK"); want && *want) {
    const char* rank = std::getenv("RANK");
    if (std::string(want) != (rank && *rank ? rank : "0")) return;
  }
  ::kill(::getpid(), SIGKILL);
}

}  // namespace snip
