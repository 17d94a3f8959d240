// snip/io/signal_cleanup.h: remove staging folders when SIGINT or SIGTERM
// ends the process.
//
// A command that stages its output in a temporary folder (`snip data
// prepare`: OUT/.prepare.tmp.<pid>) registers the folder with a
// CleanupOnSignal guard for as long as it exists. When main() called
// install_signal_cleanup() first, SIGINT and SIGTERM no longer end the
// process at once: a watcher thread receives them (sigwait), removes every
// registered folder (and the parent a guard names, if it is then empty),
// prints one line to stderr
//
//   snip: interrupted by SIGTERM: removed data/brown/.prepare.tmp.4242
//
// and ends the process by the same signal with its default action. The exit
// status is thus the conventional one: a shell shows 128 + the signal number
// (130 for SIGINT, 143 for SIGTERM), and a shell loop or make that sees a
// child die of SIGINT stops as well (an exit(130) would not tell it).
//
// Why a thread and sigwait rather than a signal handler: removing a folder
// tree is not async-signal-safe, the watcher runs ordinary code. The signals
// are blocked in the calling thread before any other thread starts, and
// threads inherit that mask, so only the watcher ever receives them. A signal
// the process ignores on entry (SIG_IGN, e.g. SIGINT for a background job of
// a script, or under nohup) stays ignored.
//
// Without install_signal_cleanup() (unit tests, the LibTorch `snip` binary)
// the guards cost a mutex and do nothing else: a signal ends the process at
// once, and the next `snip data prepare` removes the stale folder
// (snip/data/prepare.h).
//
// Plain C++17 + POSIX; no LibTorch.
#pragma once

#include <cstdint>
#include <string>

namespace snip::io {

/// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread
/// it starts later) and starts the watcher thread described above. Call once,
/// first thing in main(), before any other thread exists. Later calls do
/// nothing.
void install_signal_cleanup();

/// While alive, `dir` is removed (recursively) if SIGINT or SIGTERM ends the
/// process; so is `remove_if_empty` (e.g. an output folder this run created)
/// when it is non-empty and, after that, an empty folder. The destructor
/// unregisters; it does not remove anything itself.
class CleanupOnSignal {
 public:
  explicit CleanupOnSignal(std::string dir, std::string remove_if_empty = "");
  ~CleanupOnSignal();
  CleanupOnSignal(const CleanupOnSignal&) = delete;
  CleanupOnSignal& operator=(const CleanupOnSignal&) = delete;

 private:
  uint64_t id_;
};

}  // namespace snip::io
