// `snip sample`: what a trained model writes (see snip/train/sample.h).
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.h"
#include "snip/config/config.h"
#include "snip/data/token_client.h"
#include "snip/model/hf.h"
#include "snip/run/trainer_state.h"
#include "snip/train/checkpoint.h"
#include "snip/train/sample.h"
#include "snip/core/error.h"

namespace snip::cli {

namespace fs = std::filesystem;

// Enough for any prompt continuation a person reads; no KV cache, so each
// token costs a forward over the whole context.
constexpr int64_t kMaxNewTokens = 100000;

void add_sample_commands(CLI::App& app) {
  struct Args {
    std::string run_dir, checkpoint, prompt, tokenizer;
    SampleOptions o;
    int64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* s = app.add_subcommand("sample", "text a checkpoint, or a Hugging Face folder, writes after a prompt");
  s->add_option("--run-dir", a->run_dir, "run directory (its newest checkpoint, with the tokenizer it carries)");
  s->add_option("--checkpoint", a->checkpoint,
                "a checkpoint folder (default: the run's newest; it carries its tokenizer), or a Hugging Face folder "
                "(config.json + model.safetensors, with its tokenizer.model unless --tokenizer is given)");
  s->add_option("--prompt", a->prompt, "text to continue")->required();
  s->add_option("--max-new-tokens", a->o.max_new_tokens, "tokens to generate")->capture_default_str();
  s->add_option("--temperature", a->o.temperature, "softmax temperature; 0 = greedy")->capture_default_str();
  s->add_option("--top-k", a->o.top_k, "sample among the k most likely tokens; 0 = all")->capture_default_str();
  s->add_option("--seed", a->seed, "seed of the draws, >= 0 (same seed, same text)")->capture_default_str();
  s->add_option("--tokenizer", a->tokenizer,
                "tokenizer.model (default: the checkpoint's or Hugging Face folder's own; a checkpoint of an earlier snip: "
                "its data folder's)");
  s->callback([a] {
    if (a->seed < 0) fail("--seed: expected an integer >= 0, got ", a->seed);
    a->o.seed = uint64_t(a->seed);
    if (!std::isfinite(a->o.temperature)) fail("--temperature: expected a finite number >= 0, got ", a->o.temperature);
    if (a->o.max_new_tokens > kMaxNewTokens)
      fail("--max-new-tokens: expected at most ", kMaxNewTokens, ", got ", a->o.max_new_tokens);
    if (a->run_dir.empty() && a->checkpoint.empty()) fail("give --run-dir or --checkpoint");
    // A snip checkpoint (trainer_state.json) or a Hugging Face folder, as `snip eval` reads them.
    const fs::path given(a->checkpoint);
    const bool hf = !a->checkpoint.empty() && is_hf_folder(a->checkpoint);
    check_run_dir(a->run_dir);
    const fs::path run(a->run_dir);
    std::string ckpt = a->checkpoint.empty() ? latest_checkpoint(a->run_dir) : a->checkpoint;
    if (ckpt.empty()) fail("--run-dir: no complete checkpoint in ", (run / "checkpoints").string());
    // The tokenizer: --tokenizer, else a Hugging Face folder's own, else the
    // checkpoint's (checkpoint_tokenizer: its own copy, or for an older
    // checkpoint its data folder's). meta.json beside a prepared tokenizer
    // (or the checkpoint's record) names EOS, where a sample stops.
    std::string tok = a->tokenizer;
    int64_t eos_id = -1, tok_vocab = -1;
    if (tok.empty() && hf) {
      tok = (given / "tokenizer.model").string();
      if (!fs::is_regular_file(tok))
        fail("--checkpoint ", ckpt, " has no tokenizer.model (give --tokenizer)");
    } else if (tok.empty()) {
      const nlohmann::json st = verify_checkpoint(ckpt);
      const HfTokenizer t = checkpoint_tokenizer(ckpt, st);
      tok = t.model_path;
      eos_id = t.eos_id;
      const TrainerState ts = TrainerState::from_json(st, ckpt + "/trainer_state.json");
      if (ts.data) tok_vocab = ts.data->vocab_size;
    } else {
      if (fs::is_directory(tok)) fail("--tokenizer: ", tok, " is a folder; give its tokenizer.model");
      if (!fs::is_regular_file(tok)) fail("--tokenizer: ", tok, " does not exist");
      const data::TokenizerMeta meta = data::TokenizerMeta::read(fs::path(tok).parent_path().string());
      eos_id = meta.eos_id;
      tok_vocab = meta.vocab_size;
    }
    LlamaForCausalLM model = hf ? import_hf(ckpt) : load_checkpoint_model(ckpt);
    const data::TokenizerClient client(data::TokenizerClient::sibling_program(), tok);
    const std::vector<int32_t> prompt = client.encode(a->prompt, /*bos=*/true);
    // Ids beyond the model's vocabulary would decode to nothing or fail.
    for (int32_t id : prompt)
      if (id >= model->cfg.vocab_size)
        fail("tokenizer ", tok, " gives id ", id, " but the model in ", ckpt, " has ", model->cfg.vocab_size,
             " (another tokenizer than the model's?)");
    if (tok_vocab > model->cfg.vocab_size)
      fail("tokenizer ", tok, " has ", tok_vocab, " pieces but the model in ", ckpt, " only ",
           model->cfg.vocab_size, " (another tokenizer than the model's?)");
    a->o.eos_id = eos_id;
    a->o.vocab_limit = tok_vocab;  // the tokenizer's ids only (-1: unknown, all of the model's)
    if (hf) {
      const nlohmann::json& c = read_hf_folder(ckpt).config_json;
      if (c.contains("eos_token_id") && c["eos_token_id"].is_number_integer()) a->o.eos_id = c["eos_token_id"].get<int64_t>();
    }
    const std::vector<int32_t> ids = sample(model, prompt, a->o);
    std::cout << client.decode(ids) << "\n";
  });
}

}  // namespace snip::cli
