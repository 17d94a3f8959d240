// A run's tokenizer through `snip-data` (see token_client.h).
#include "snip/data/token_client.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "snip/core/error.h"

extern char** environ;

namespace snip::data {

namespace {

// Writes all of `s` to fd (the child reads its whole input before writing).
void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the child died; its exit status says why
    done += size_t(n);
  }
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

}  // namespace

TokenizerMeta TokenizerMeta::read(const std::string& folder) {
  TokenizerMeta m;
  std::ifstream in(std::filesystem::path(folder) / "meta.json");
  if (!in) return m;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto int_at = [&](const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : int64_t{-1};
  };
  m.vocab_size = int_at("vocab_size");
  m.eos_id = int_at("eos_id");
  return m;
}

TokenizerClient::TokenizerClient(std::string program, std::string model)
    : program_(std::move(program)), model_(std::move(model)) {}

std::string TokenizerClient::sibling_program() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto p = self.parent_path() / "snip-data";
  return std::filesystem::exists(p, ec) ? p.string() : "";
}

std::string TokenizerClient::run(const std::string& verb, const std::string& input, bool bos) const {
  if (program_.empty()) fail("tokenizer: no snip-data program to run (it is built beside snip)");
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC))
    fail("tokenizer: cannot create pipes: ", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<std::string> args = {program_, "data", verb, "--tokenizer", model_};
  if (bos) args.push_back("--bos");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program_.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]), ::close(out[1]), ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]), ::close(out[0]), ::close(err[0]);
    fail("tokenizer: cannot run ", program_, ": ", std::strerror(rc));
  }
  // A child that exits early must not kill us with SIGPIPE.
  struct sigaction ign {}, old {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old);
  write_all(in[1], input);
  ::close(in[1]);
  sigaction(SIGPIPE, &old, nullptr);
  const std::string result = read_all(out[0]);
  const std::string errors = read_all(err[0]);
  ::close(out[0]), ::close(err[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string last = errors;
    while (!last.empty() && last.back() == '\n') last.pop_back();
    if (last.find('\n') != std::string::npos) last = last.substr(last.rfind('\n') + 1);
    const std::string child_prefix = "snip: error: ";  // the child's own one-line error
    if (last.rfind(child_prefix, 0) == 0) last = last.substr(child_prefix.size());
    fail("tokenizer ", model_, ": ", program_, " data ", verb, " failed: ", last.empty() ? "(no message)" : last);
  }
  return result;
}

std::vector<int32_t> TokenizerClient::encode(const std::string& text, bool bos) const {
  std::istringstream is(run("encode", text, bos));
  std::vector<int32_t> ids;
  for (long v; is >> v;) ids.push_back(int32_t(v));
  return ids;
}

std::string TokenizerClient::decode(const std::vector<int32_t>& ids) const {
  std::ostringstream os;
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? " " : "") << ids[i];
  return run("decode", os.str(), false);
}

}  // namespace snip::data
