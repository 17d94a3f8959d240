// Hugging Face folder export/import: round trip, dtype conversion, and
// rejection of folders that do not describe this model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>

#include "snip/model/hf.h"
#include "snip/io/atomic_file.h"
#include "snip/util/error.h"
#include "micro.h"

using namespace snip;
namespace fs = std::filesystem;

namespace {

LlamaConfig small(bool tied) {
  LlamaConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

std::string tmpdir(const std::string& n) {
  const auto d = fs::temp_directory_path() / ("snip-hf-" + n + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  return d.string();
}

using test::error_of;

}  // namespace

TEST(HuggingFace, ExportImportRoundTripIsExact) {
  for (bool tied : {false, true}) {
    torch::manual_seed(1);
    LlamaForCausalLM m(small(tied));
    const std::string dir = tmpdir(tied ? "tied" : "untied");
    export_hf(m, dir);
    const auto cfg = nlohmann::json::parse(io::read_file(dir + "/config.json"));
    EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["tie_word_embeddings"], tied);
    LlamaForCausalLM back = import_hf(dir);
    auto a = m->hf_parameters(), b = back->hf_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    }
    torch::Tensor ids = torch::randint(0, 50, {2, 7}, torch::kLong);
    EXPECT_TRUE(torch::equal(m(ids), back(ids)));
    // BF16 export over the F32 one (--force): every weight rounds to BF16
    // (relative error <= 2^-9).
    export_hf(m, dir, at::kBFloat16, /*force=*/true);
    LlamaForCausalLM b16 = import_hf(dir);
    for (auto& [n, p] : m->hf_parameters()) {
      const auto q = b16->named_parameters()[n];
      EXPECT_TRUE(torch::equal(q, p.detach().to(at::kBFloat16).to(at::kFloat))) << n;
    }
    fs::remove_all(dir);
  }
}

TEST(HuggingFace, MismatchedFoldersAreRejected) {
  LlamaForCausalLM m(small(false));
  const std::string dir = tmpdir("bad");
  export_hf(m, dir);
  // Weights of another shape.
  LlamaConfig other = small(false);
  other.hidden_size = 32;
  LlamaForCausalLM o(other);
  io::write_safetensors(dir + "/model.safetensors", model_to_safetensors(o));
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("has shape [50, 32], expected [50, 16]"), std::string::npos);
  // A missing tensor.
  io::SafeTensors st = model_to_safetensors(m);
  st.tensors.pop_back();
  io::write_safetensors(dir + "/model.safetensors", st);
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("missing tensor 'lm_head.weight'"), std::string::npos);
  // Config problems.
  io::write_file_atomic(dir + "/config.json", "{\"vocab_size\": 50}");
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("missing field 'hidden_size'"), std::string::npos);
  io::write_file_atomic(dir + "/config.json", "not json");
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("invalid JSON"), std::string::npos);
  nlohmann::json j = small(false).to_hf_json();
  j["num_key_value_heads"] = 3;
  io::write_file_atomic(dir + "/config.json", j.dump());
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("not divisible by num_key_value_heads 3"), std::string::npos);
  fs::remove_all(dir);
}

TEST(HuggingFace, ExportRefusesNonEmptyAndCheckpointFolders) {
  torch::manual_seed(3);
  LlamaForCausalLM m(small(true));
  const std::string root = tmpdir("refuse");
  fs::create_directories(root + "/out");
  io::write_file_atomic(root + "/out/notes.txt", "keep me\n");
  // A non-empty folder: refused, nothing written.
  EXPECT_NE(error_of([&] { export_hf(m, root + "/out"); }).find("is not empty; choose a new folder, or pass --force"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(root + "/out/model.safetensors"));
  // --force: written beside the other file, which stays.
  export_hf(m, root + "/out", at::kFloat, /*force=*/true);
  EXPECT_TRUE(fs::exists(root + "/out/model.safetensors"));
  EXPECT_EQ(io::read_file(root + "/out/notes.txt"), "keep me\n");
  // A checkpoint folder of a run, even with --force, and the checkpoints/ folder itself.
  const std::string ckpt = root + "/run/checkpoints/step-4";
  fs::create_directories(ckpt);
  io::write_file_atomic(ckpt + "/trainer_state.json", "{}\n");
  for (const std::string& d : {ckpt, ckpt + "/", root + "/run/checkpoints", root + "/run/checkpoints/step-9"}) {
    SCOPED_TRACE(d);
    EXPECT_NE(error_of([&] { export_hf(m, d, at::kFloat, true); }).find("is a checkpoint folder of a run"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(ckpt + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(root + "/run/checkpoints/step-9"));
  // An empty folder needs no --force.
  fs::create_directories(root + "/empty");
  export_hf(m, root + "/empty");
  EXPECT_TRUE(fs::exists(root + "/empty/config.json"));
  fs::remove_all(root);
}

TEST(HuggingFace, FailedExportLeavesNoFolderBehind) {
  torch::manual_seed(3);
  LlamaForCausalLM m(small(true));
  const std::string root = tmpdir("full");
  fs::create_directories(root);
  // Disk full, as the export sees it: no file may grow past 4 KiB
  // (model.safetensors of this model is ~20 KiB; writes fail with EFBIG).
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit small_limit = old;
  small_limit.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small_limit), 0);
  const std::string m1 = error_of([&] { export_hf(m, root + "/new"); });
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(m1.find("File too large"), std::string::npos) << m1;
  EXPECT_FALSE(fs::exists(root + "/new"));  // created by the export, removed with its failure
  EXPECT_TRUE(fs::is_empty(root));
  fs::remove_all(root);
}
