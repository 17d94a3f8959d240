// prepare_data end to end on small synthetic corpora: split sizes, shard
// contents checked by re-encoding the documents, idempotence, determinism,
// and every error leaving no files behind. Also `snip data prepare` through the
// built snip-data program.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "snip/data/prepare.h"
#include "snip/data/shard.h"
#include "snip/data/tokenizer.h"
#include "../common/program.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace snip::data {
namespace {

using testing::read_bytes;
using testing::TempDir;
using testing::user_error_of;
using testing::write_text;

PrepareOptions small_options(const TempDir& t, const std::string& out = "out") {
  PrepareOptions o;
  o.inputs = {t / "corpus"};
  o.out_dir = t / out;
  o.vocab_size = 320;
  o.val_fraction = 0.05;
  o.seed = 11;
  return o;
}

// Splits a shard into documents at BOS and decodes each.
std::vector<std::string> decode_docs(const Tokenizer& tok, const std::string& shard) {
  const ShardReader r(shard);
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (uint64_t i = 0; i < r.size(); ++i) {
    const auto id = static_cast<int32_t>(r[i]);
    if (id == tok.bos_id()) {
      EXPECT_TRUE(cur.empty()) << "BOS must follow EOS";
      continue;
    }
    if (id == tok.eos_id()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
      continue;
    }
    cur.push_back(id);
  }
  EXPECT_TRUE(cur.empty()) << "shard must end with EOS";
  return docs;
}

TEST(Prepare, WritesShardsHoldingEveryDocumentOnce) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 200);
  std::vector<std::string> lines;
  const PrepareSummary s = prepare_data(small_options(t), [&](const std::string& l) { lines.push_back(l); });
  EXPECT_FALSE(s.up_to_date);
  EXPECT_EQ(s.documents, 200u);
  EXPECT_EQ(s.val_documents, 10u);  // round(0.05 * 200)
  EXPECT_EQ(s.train_documents, 190u);
  EXPECT_EQ(s.vocab_size, 320);
  EXPECT_TRUE(s.tokenizer_trained);
  EXPECT_GE(lines.size(), 4u);

  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(t / "out")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"meta.json", "tokenizer.model", "train.bin", "val.bin"}));

  const Tokenizer tok = Tokenizer::load(t / "out/tokenizer.model");
  auto train = decode_docs(tok, t / "out/train.bin");
  auto val = decode_docs(tok, t / "out/val.bin");
  EXPECT_EQ(train.size(), 190u);
  EXPECT_EQ(val.size(), 10u);
  // Together they are exactly the corpus (order aside), each document once.
  std::vector<std::string> all = train;
  all.insert(all.end(), val.begin(), val.end());
  std::sort(all.begin(), all.end());
  auto expected = testing::synthetic_docs(200);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(all, expected);
  // Token counts: sum of [bos] + pieces + [eos] over the documents.
  uint64_t total = 0;
  for (const auto& d : expected) total += tok.encode(d).size() + 2;
  EXPECT_EQ(s.train_tokens + s.val_tokens, total);
  EXPECT_EQ(ShardReader(t / "out/train.bin").size(), s.train_tokens);

  const auto meta = nlohmann::json::parse(read_bytes(t / "out/meta.json"));
  EXPECT_EQ(meta["documents"]["val"], 10);
  EXPECT_EQ(meta["tokens"]["train"], s.train_tokens);
  EXPECT_EQ(meta["vocab_size"], 320);
  EXPECT_EQ(meta["seed"], 11);
  EXPECT_EQ(meta["tokenizer"]["sha256"], sha256_hex(read_bytes(t / "out/tokenizer.model")));
  EXPECT_EQ(meta["sources"][0]["documents"], 200);
  EXPECT_EQ(meta["sources"][0]["kind"], "folder");
}

TEST(Prepare, SecondRunIsUpToDateAndChangesRebuild) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 40);
  const auto opt = small_options(t);
  const auto first = prepare_data(opt);
  const auto mtime = fs::last_write_time(t / "out/train.bin");
  const auto again = prepare_data(opt);
  EXPECT_TRUE(again.up_to_date);
  EXPECT_EQ(again.train_tokens, first.train_tokens);
  EXPECT_EQ(again.val_documents, first.val_documents);
  EXPECT_EQ(again.tokenizer_sha256, first.tokenizer_sha256);
  EXPECT_EQ(fs::last_write_time(t / "out/train.bin"), mtime);

  auto other = opt;
  other.seed = 12;
  EXPECT_FALSE(prepare_data(other).up_to_date);
  write_text(t / "corpus/extra.txt", "a new document about the loader");
  const auto grown = prepare_data(other);
  EXPECT_FALSE(grown.up_to_date);
  EXPECT_EQ(grown.documents, 41u);
  fs::remove(t / "out/val.bin");
  EXPECT_FALSE(prepare_data(other).up_to_date) << "missing shard forces a rebuild";
}

// A PID that surely names no process: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int status = 0;
  ::waitpid(p, &status, 0);
  return p;
}

// A killed prepare leaves OUT/.prepare.tmp.<pid>/ behind; the next run removes
// such folders when <pid> is gone (kill(pid, 0) fails with ESRCH), and only
// then: a live process may be preparing into the same folder.
TEST(Prepare, RemovesStaleStagingFoldersOfDeadProcesses) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 30);
  const auto o = small_options(t);
  const std::string dead = t / ("out/.prepare.tmp." + std::to_string(dead_pid()));
  const std::string alive = t / ("out/.prepare.tmp." + std::to_string(::getppid()));  // the test runner's parent
  const std::string not_a_pid = t / "out/.prepare.tmp.12ab";
  write_text(dead + "/train.bin", "partial shard of a killed run");
  write_text(alive + "/train.bin", "another prepare at work");
  write_text(not_a_pid + "/x", "not ours");
  const bool fixed_pid_is_free = ::kill(999999, 0) == -1 && errno == ESRCH;
  if (fixed_pid_is_free) write_text(t / "out/.prepare.tmp.999999/val.bin", "partial");
  std::vector<std::string> lines;
  prepare_data(o, [&](const std::string& l) { lines.push_back(l); });
  EXPECT_FALSE(fs::exists(dead));
  if (fixed_pid_is_free) {
    EXPECT_FALSE(fs::exists(t / "out/.prepare.tmp.999999"));
  }
  EXPECT_TRUE(fs::exists(alive + "/train.bin"));
  EXPECT_TRUE(fs::exists(not_a_pid + "/x"));
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "removed stale staging folder " + dead + " (process " + dead.substr(dead.rfind('.') + 1) +
                          " is gone)"),
            lines.end());
  // An up-to-date rerun cleans up too (the stale folder may come from a killed
  // run with other options).
  write_text(dead + "/val.bin", "partial");
  EXPECT_TRUE(prepare_data(o).up_to_date);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive + "/train.bin"));
}

TEST(Prepare, DeterministicBytes) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 60);
  prepare_data(small_options(t, "a"));
  prepare_data(small_options(t, "b"));
  for (const char* f : {"tokenizer.model", "train.bin", "val.bin"})
    EXPECT_EQ(read_bytes(t / (std::string("a/") + f)), read_bytes(t / (std::string("b/") + f))) << f;
}

TEST(Prepare, ValidationShareRules) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 2);
  auto o = small_options(t);
  o.vocab_size = 290;
  o.val_fraction = 0.01;
  auto s = prepare_data(o);
  EXPECT_EQ(s.val_documents, 1u) << "at least one validation document when there are >= 2";
  EXPECT_EQ(s.train_documents, 1u);

  testing::write_synthetic_folder(t / "one", 1);
  o.inputs = {t / "one"};
  o.out_dir = t / "out1";
  s = prepare_data(o);
  EXPECT_EQ(s.val_documents, 0u);
  EXPECT_EQ(ShardReader(t / "out1/val.bin").size(), 0u);

  testing::write_synthetic_folder(t / "many", 300);
  o.inputs = {t / "many"};
  o.out_dir = t / "out2";
  o.vocab_size = 320;
  o.val_fraction = 0.1;
  s = prepare_data(o);
  EXPECT_EQ(s.val_documents, 30u);
  o.val_fraction = 0.0;
  o.out_dir = t / "out3";
  EXPECT_EQ(prepare_data(o).val_documents, 0u);
}

TEST(Prepare, JsonlAndTextFileInputsWithGivenTokenizer) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 40);
  prepare_data(small_options(t));
  const auto docs = testing::synthetic_docs(6, 99);
  std::string jsonl, text;
  for (const auto& d : docs) {
    jsonl += nlohmann::json{{"body", d}}.dump() + "\n";
    text += d + "\n\n\n";
  }
  write_text(t / "d.jsonl", jsonl);
  write_text(t / "d.txt", text);
  PrepareOptions o;
  o.inputs = {t / "d.jsonl", t / "d.txt"};
  o.text_field = "body";
  o.out_dir = t / "out2";
  o.tokenizer_model = t / "out/tokenizer.model";
  const auto s = prepare_data(o);
  EXPECT_FALSE(s.tokenizer_trained);
  EXPECT_EQ(s.vocab_size, 320);
  ASSERT_EQ(s.sources.size(), 2u);
  EXPECT_EQ(s.sources[0].kind, "jsonl");
  EXPECT_EQ(s.sources[0].documents, 6u);
  EXPECT_EQ(s.sources[1].kind, "text");
  EXPECT_EQ(s.sources[1].documents, 6u);
  EXPECT_EQ(read_bytes(t / "out2/tokenizer.model"), read_bytes(t / "out/tokenizer.model"));
}

// Errors: one line, and the output folder is left as it was.
class PrepareErrors : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_synthetic_folder(t_ / "corpus", 20); }
  std::string run(PrepareOptions o) { return user_error_of([&] { prepare_data(o); }); }
  TempDir t_;
};

TEST_F(PrepareErrors, MissingInputPath) {
  auto o = small_options(t_);
  o.inputs.push_back(t_ / "nope.txt");
  EXPECT_EQ(run(o), "input path " + (t_ / "nope.txt") + " does not exist");
  EXPECT_FALSE(fs::exists(t_ / "out"));
}

TEST_F(PrepareErrors, EmptyCorpus) {
  write_text(t_ / "blank/a.txt", "   \n\n");
  write_text(t_ / "blank/b.jsonl", "{\"text\": \" \"}\n");
  auto o = small_options(t_);
  o.inputs = {t_ / "blank"};
  const std::string msg = run(o);
  EXPECT_NE(msg.find("corpus is empty"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(t_ / "out")) << "out_dir created by the failed call is removed";
}

TEST_F(PrepareErrors, BadJsonlKeepsExistingFolderUntouched) {
  write_text(t_ / "out/notes.txt", "user file");
  write_text(t_ / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"x\",}\n");
  auto o = small_options(t_);
  o.inputs.push_back(t_ / "bad.jsonl");
  const std::string msg = run(o);
  EXPECT_NE(msg.find(t_ / "bad.jsonl:2: invalid JSON"), std::string::npos) << msg;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(t_ / "out")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"notes.txt"}));
}

TEST_F(PrepareErrors, VocabTooLargeLeavesNoFiles) {
  auto o = small_options(t_);
  o.vocab_size = 50000;
  const std::string msg = run(o);
  EXPECT_NE(msg.find("vocab_size 50000 is too large for this corpus"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(t_ / "out"));
}

// SentencePiece's own messages for tiny vocabularies are internal ("[insert_id(
// trainer_spec_.bos_id(), ...)]"); the range is checked first. Lower bound
// 261 = 3 special pieces + 256 byte-fallback pieces + "▁" + one character,
// reached by a one-character corpus; upper bound 2^22 = model.vocab_size's cap.
TEST_F(PrepareErrors, VocabSizeOutOfRange) {
  for (int v : {-5, 0, 1, 2, 260, 4194305}) {
    auto o = small_options(t_);
    o.vocab_size = v;
    EXPECT_EQ(run(o), "vocab_size: expected an integer in [261, 4194304], got " + std::to_string(v));
    EXPECT_FALSE(fs::exists(t_ / "out"));
  }
  // The bound is attainable: "a" needs exactly 3 + 256 + 2 ("▁", "a") pieces.
  write_text(t_ / "one/a.txt", "a\n");
  auto o = small_options(t_);
  o.inputs = {t_ / "one"};
  o.val_fraction = 0;
  o.vocab_size = 261;
  EXPECT_EQ(prepare_data(o).vocab_size, 261);
  // With a given tokenizer the option is ignored, as documented.
  auto g = small_options(t_, "out2");
  g.tokenizer_model = t_ / "out/tokenizer.model";
  g.vocab_size = 1;
  EXPECT_EQ(prepare_data(g).vocab_size, 261);
}

TEST_F(PrepareErrors, UnwritableOutDir) {
  write_text(t_ / "file", "x");
  auto o = small_options(t_);
  o.out_dir = t_ / "file/sub";
  const std::string msg = run(o);
  EXPECT_NE(msg.find("output directory " + (t_ / "file/sub")), std::string::npos) << msg;
}

TEST_F(PrepareErrors, BadOptions) {
  auto o = small_options(t_);
  o.val_fraction = 1.0;
  EXPECT_NE(run(o).find("val_fraction"), std::string::npos);
  o = small_options(t_);
  o.inputs.clear();
  EXPECT_NE(run(o).find("no corpus given"), std::string::npos);
  o = small_options(t_);
  o.corpus = "wiki";
  EXPECT_NE(run(o).find("corpus: expected \"kjv\", \"wordnet\", \"brown\" or none"), std::string::npos);
  o = small_options(t_);
  o.tokenizer_model = t_ / "corpus/doc000.txt";
  EXPECT_NE(run(o).find("not a SentencePiece model"), std::string::npos);
  EXPECT_FALSE(fs::exists(t_ / "out"));
}

// ---- CLI: snip data prepare, through the built snip-data program

// Runs `snip-data data prepare <args>` (tests/common/program.h).
test::Ran prepare_cli(std::vector<std::string> args) {
  args.insert(args.begin(), {"data", "prepare"});
  return test::run_program(SNIP_DATA_EXE, args);
}

TEST(CliDataPrepare, HelpShowsDefaults) {
  const test::Ran r = prepare_cli({"--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* s : {"--input", "--corpus", "kjv", "wordnet", "brown", "data/CORPUS", "--tokenizer", "8192", "0.01", "1234",
                        "--text-field", "data/cache"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(CliDataPrepare, RunsPrepare) {
  TempDir t;
  testing::write_synthetic_folder(t / "corpus", 30);
  const test::Ran r = prepare_cli({"--input", t / "corpus", "--out", t / "o", "--vocab-size", "300", "--val-fraction",
                                   "0.1", "--seed", "3"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("documents: 30 (27 train, 3 val)"), std::string::npos) << r.out;
  const auto meta = nlohmann::json::parse(read_bytes(t / "o/meta.json"));
  EXPECT_EQ(meta["vocab_size"], 300);
  EXPECT_EQ(meta["key"]["corpus"], nullptr) << "--input without --corpus means no Brown";
}

TEST(CliDataPrepare, VocabSizeRangeIsOneClearLine) {
  for (const std::string v : {"1", "0", "-3", "260", "4194305", "abc", "300.5"}) {
    const test::Ran r = prepare_cli({"--input", "x", "--vocab-size", v});
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.error, "--vocab-size: expected an integer in [261, 4194304], got " + v + " (see --help)");
  }
}

TEST(CliDataPrepare, UserErrorPropagates) {
  TempDir t;
  const test::Ran r = prepare_cli({"--input", t / "missing", "--out", t / "o"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.error, "input path " + (t / "missing") + " does not exist");
  EXPECT_FALSE(fs::exists(t / "o"));
}

}  // namespace
}  // namespace snip::data
