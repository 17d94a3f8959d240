// Sampling (snip/train/sample.h) against an independent greedy loop, its
// determinism, and the tokenizer client (snip/data/token_client.h) through
// the real snip-data program on the prepared Brown data.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "micro.h"
#include "snip/data/token_client.h"
#include "snip/io/atomic_file.h"
#include "snip/train/sample.h"

using namespace snip;
namespace fs = std::filesystem;

namespace {

LlamaForCausalLM tiny_model() {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 8;
  torch::manual_seed(5);
  return LlamaForCausalLM(c);
}

}  // namespace

TEST(Sample, GreedyEqualsAnArgmaxLoopOverTheCroppedContext) {
  LlamaForCausalLM m = tiny_model();
  const std::vector<int32_t> prompt = {1, 7, 3};
  SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 12;  // runs past max_position_embeddings = 8: the context is cropped
  const auto got = sample(m, prompt, o);
  // Reference: the whole sequence each time, last 8 tokens, argmax of the last logits.
  torch::NoGradGuard ng;
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  for (int k = 0; k < 12; ++k) {
    const size_t start = ids.size() > 8 ? ids.size() - 8 : 0;
    const auto in = torch::tensor(std::vector<int64_t>(ids.begin() + long(start), ids.end())).unsqueeze(0);
    const auto logits = m(in)[0][in.size(1) - 1];
    ids.push_back(logits.argmax().item<int64_t>());
  }
  ASSERT_EQ(got.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(got[i], ids[i]) << i;
}

TEST(Sample, SeededDrawsRepeatAndTopOneIsGreedy) {
  LlamaForCausalLM m = tiny_model();
  SampleOptions o;
  o.temperature = 1.0;
  o.top_k = 0;
  o.max_new_tokens = 20;
  o.seed = 11;
  const auto a = sample(m, {2}, o), b = sample(m, {2}, o);
  EXPECT_EQ(a, b);
  o.seed = 12;
  // An untrained model's distribution is near uniform over 40 tokens: 20
  // draws under another seed coincide with probability ~ (1/40)^20.
  EXPECT_NE(sample(m, {2}, o), a);
  o.top_k = 1;  // only the most likely token survives: greedy, whatever the seed
  SampleOptions g = o;
  g.temperature = 0;
  EXPECT_EQ(sample(m, {2}, o), sample(m, {2}, g));
  // Stops right after the end-of-document id: take the first generated token
  // as EOS, and the sample is the prompt plus that token.
  g.eos_id = sample(m, {2}, g)[1];
  EXPECT_EQ(sample(m, {2}, g), (std::vector<int32_t>{2, int32_t(g.eos_id)}));
}

// A model vocabulary larger than its tokenizer's (an --init-from model on
// another tokenizer's data): ids past vocab_limit decode to nothing, so
// they are never drawn; below it the draws are the unrestricted ones'
// restricted to the kept logits (greedy: the argmax over them).
TEST(Sample, DrawsStayBelowTheTokenizersVocabulary) {
  LlamaForCausalLM m = tiny_model();  // V = 40
  SampleOptions o;
  o.temperature = 1.0;
  o.top_k = 0;
  o.max_new_tokens = 200;
  o.vocab_limit = 10;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    o.seed = seed;
    const auto ids = sample(m, {2}, o);
    for (size_t i = 1; i < ids.size(); ++i) ASSERT_LT(ids[i], 10) << "seed " << seed << " position " << i;
  }
  SampleOptions g;
  g.temperature = 0;
  g.max_new_tokens = 1;
  g.vocab_limit = 10;
  torch::NoGradGuard ng;
  const auto logits = m(torch::tensor(std::vector<int64_t>{2}).unsqueeze(0))[0][0];
  EXPECT_EQ(sample(m, {2}, g)[1], logits.slice(0, 0, 10).argmax().item<int64_t>());
  // Without a limit, 200 near-uniform draws over 40 ids reach past 10.
  o.vocab_limit = 0;
  const auto all = sample(m, {2}, o);
  EXPECT_TRUE(std::any_of(all.begin() + 1, all.end(), [](int32_t id) { return id >= 10; }));
}

TEST(Sample, BadArgumentsAreClearErrors) {
  LlamaForCausalLM m = tiny_model();
  SampleOptions o;
  EXPECT_NE(test::error_of([&] { sample(m, {}, o); }).find("at least one token"), std::string::npos);
  EXPECT_NE(test::error_of([&] { sample(m, {40}, o); }).find("token id 40 is outside the vocabulary [0, 40)"),
            std::string::npos);
  o.temperature = -1;
  EXPECT_NE(test::error_of([&] { sample(m, {1}, o); }).find("--temperature"), std::string::npos);
}

TEST(TokenizerClient, RoundTripThroughSnipData) {
  const std::string tok = test::kKjv512 + "/tokenizer.model";
  const std::string prog = std::string(SNIP_BINARY_DIR) + "/snip-data";
  if (!fs::exists(tok) || !fs::exists(prog)) GTEST_SKIP() << "no prepared KJV data or snip-data";
  const data::TokenizerClient c(prog, tok);
  const auto meta = nlohmann::json::parse(io::read_file(test::kKjv512 + "/meta.json"));
  const auto ids = c.encode("The jury said it did find that the city", /*bos=*/true);
  ASSERT_GT(ids.size(), 2u);
  EXPECT_EQ(ids[0], meta.at("bos_id").get<int>());
  for (int32_t id : ids) EXPECT_LT(id, 512);
  EXPECT_EQ(c.encode("The jury said it did find that the city", false),
            std::vector<int32_t>(ids.begin() + 1, ids.end()));
  EXPECT_EQ(c.decode(ids), "The jury said it did find that the city");  // BOS decodes to nothing
  const data::TokenizerClient bad(prog, test::kKjv512 + "/missing.model");
  EXPECT_NE(test::error_of([&] { bad.encode("x", false); }).find("data encode failed"), std::string::npos);
}
