// cmd_sample.cpp: the command line of `snip sample` (app::run_sample,
// snip/app/checkpoint_commands.h).

#include <memory>

#include "commands.h"
#include "snip/app/checkpoint_commands.h"
#include "snip/train/sample.h"

namespace snip::cli {

void add_sample_commands(CLI::App& app) {
  auto a = std::make_shared<app::SampleRequest>();
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
  s->callback([a] { app::run_sample(*a); });
}

}  // namespace snip::cli
