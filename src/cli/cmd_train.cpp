// `snip train`, `snip eval`, `snip export`: their options; eval and export
// run in app (snip/app/checkpoint_commands.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "commands.h"
#include "snip/app/checkpoint_commands.h"
#include "snip/config/config.h"
#include "snip/data/data_folder.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/data/token_client.h"
#include "snip/hw/platform.h"
#include "snip/model/hf.h"
#include "snip/model/lora.h"
#include "snip/train/memory.h"
#include "snip/train/trainer.h"
#include "snip/core/error.h"

namespace snip::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string config_options_help() {
  std::string s = "\nConfiguration options (TOML [section] key, or --set section.key=value):\n";
  for (const auto& o : option_table()) {
    std::string allowed;
    if (!o.choices.empty()) {
      for (const auto& c : o.choices) allowed += (allowed.empty() ? "" : "|") + c;
      allowed = " {" + allowed + "}";
    } else if (o.type == OptionType::kInt || o.type == OptionType::kFloat) {
      const std::string r = o.range.describe(o.type == OptionType::kInt);
      if (!r.empty()) allowed = " (" + r + ")";
    }
    s += fmt::format("  {:<34} default {:<14} {}{}{}\n", o.key, format_option_value(o.def), o.help,
                     o.unit.empty() ? "" : " [" + o.unit + "]", allowed);
  }
  return s;
}

struct TrainArgs {
  std::string config, run_dir, init_from;
  std::vector<std::string> sets;
  bool resume = false, allow_other_tokenizer = false;
  int nproc_per_node = 1;
};

// argv[1..] without --nproc-per-node N / --nproc-per-node=N: what each rank runs.
std::vector<std::string> rank_args(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 1; i < argv.size(); ++i) {
    if (argv[i] == "--nproc-per-node") {
      ++i;
      continue;
    }
    if (argv[i].rfind("--nproc-per-node=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

}  // namespace

void add_train_commands(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* train = app.add_subcommand("train", "train a model (see the configuration options below)");
  train->add_option("--config,-c", args->config, "TOML run configuration (e.g. configs/tiny.toml); "
                                                  "optional with --resume (the run's config.toml is used)");
  train->add_option("--set", args->sets, "override one option: section.key=value (repeatable)");
  train->add_option("--run-dir", args->run_dir, "run directory (default: runs/<config file stem>)");
  train->add_flag("--resume", args->resume, "continue from the run directory's newest checkpoint");
  train->add_flag("--allow-other-tokenizer", args->allow_other_tokenizer,
                  "with --resume or --init-from: train although data.dir's tokenizer is not the one the "
                  "checkpoint was trained with, or the --init-from folder's tokenizer.model");
  train->add_option("--init-from", args->init_from, "initialise weights from a Hugging Face folder "
                                                    "(config.json + model.safetensors)");
  train->add_option("--nproc-per-node", args->nproc_per_node,
                    "start this many data-parallel ranks on this machine (c10d/Gloo on 127.0.0.1), as "
                    "torchrun --nproc_per_node would; docs/distributed.md")
      ->capture_default_str();
  train->footer(config_options_help());
  train->callback([args] {
    if (args->nproc_per_node != 1) {
      const int status = launch_local_ranks(args->nproc_per_node, rank_args(program_args()));
      std::cout.flush();
      std::exit(status);
    }
    Config cfg;
    std::string run_dir = args->run_dir;
    if (args->resume && args->config.empty()) {
      if (run_dir.empty()) fail("--resume needs --run-dir or --config");
      const std::string saved = (fs::path(run_dir) / "config.toml").string();
      if (!fs::exists(saved)) fail("--resume: ", saved, " does not exist");
      cfg.load_toml_file(saved);
    } else {
      if (args->config.empty()) fail("--config FILE is required (e.g. --config configs/tiny.toml)");
      cfg.load_toml_file(args->config);
    }
    for (const auto& s : args->sets) cfg.set_override(s);
    if (run_dir.empty()) run_dir = "runs/" + fs::path(args->config).stem().string();
    TrainOptions opts;
    opts.run_dir = run_dir;
    opts.resume = args->resume;
    opts.init_from = args->init_from;
    opts.allow_other_tokenizer = args->allow_other_tokenizer;
    opts.snip_data = data::TokenizerClient::sibling_program();
    opts.faults = FaultInjector::from_env();  // test-only (SNIP_TEST_FAULT, SNIP_TEST_PERTURB_*)
    TrainSummary s = snip::train(cfg, opts);
    if (s.stopped_by_signal) {
      // Stopped by Ctrl-C or SIGTERM with a checkpoint: say where and how to
      // go on, then end by the same signal (exit status 128 + signal number,
      // 130 / 143, and a calling shell loop or Slurm sees the signal).
      std::cout.flush();
      // How to go on: the same number of ranks, started the same way (one
      // process would fail under pipeline stages, and read half the tokens
      // per step under data parallelism).
      std::string again = "snip train --run-dir " + s.run_dir + " --resume";
      if (s.launcher == "snip --nproc-per-node")
        again = fmt::format("snip train --nproc-per-node {} --run-dir {} --resume", s.world_size, s.run_dir);
      else if (s.world_size > 1)
        again = fmt::format("{} on each of the {} ranks, started as before ({})", again, s.world_size, s.launcher);
      if (s.rank == 0)
        std::fprintf(stderr, "snip: stopped by %s at step %lld: checkpoint %s; continue with: %s\n",
                     s.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(s.steps),
                     s.checkpoint.c_str(), again.c_str());
      std::fflush(stderr);
      std::signal(s.stopped_by_signal, SIG_DFL);
      std::raise(s.stopped_by_signal);
    }
    if (s.rank != 0) return;  // rank 0 prints the summary (docs/distributed.md)
    app::print_train_summary(s, std::cout);
  });

  auto ea = std::make_shared<app::EvalRequest>();
  CLI::App* ev = app.add_subcommand("eval", "validation loss and perplexity of a checkpoint, with FP32 GEMMs and no quantizer "
                                    "(the weights' own quality; the run's evaluations use its precision)");
  ev->add_option("--run-dir", ea->run_dir, "run directory (its newest checkpoint and config are used)");
  ev->add_option("--checkpoint", ea->checkpoint,
                 "a checkpoint folder (default: newest of --run-dir), or a Hugging Face folder (config.json + "
                 "model.safetensors, e.g. from snip export; needs --data)");
  ev->add_option("--data", ea->data, "prepared data folder (default: the run's data.dir, or the one the checkpoint was trained on)");
  ev->add_option("--batches", ea->batches, "micro-batches to evaluate; 0 = the whole validation split")
      ->capture_default_str();
  ev->add_option("--batch-size", ea->batch, "sequences per micro-batch")->capture_default_str();
  ev->add_option("--seq-len", ea->seq, "tokens per sequence (default: the run's train.seq_len, else min(256, max_position_embeddings))");
  ev->add_flag("--allow-other-tokenizer", ea->allow_other_tokenizer,
               "evaluate although --data was tokenized with another tokenizer than the model's");
  ev->add_option("--logits-out", ea->logits_out,
                 "also write the first micro-batch and its logits as a safetensors file: input_ids I64 [B, T], "
                 "logits F32 [B, T, V] (to compare with transformers on the same ids)");
  ev->callback([ea] { app::run_eval(*ea); });

  auto xa = std::make_shared<app::ExportRequest>();
  CLI::App* ex = app.add_subcommand("export", "write a checkpoint as a Hugging Face folder "
                                              "(config.json, model.safetensors and the tokenizer)");
  ex->add_option("--run-dir", xa->run_dir, "run directory (its newest checkpoint is used)");
  ex->add_option("--checkpoint", xa->checkpoint, "a checkpoint folder");
  ex->add_option("--out", xa->out, "output folder (new or empty; never a checkpoint folder)")->required();
  ex->add_flag("--force", xa->force, "replace config.json, model.safetensors and the tokenizer files in a non-empty --out");
  ex->add_flag("--merge", xa->merge,
               "LoRA checkpoints: fold the adapters into the base weights (W + alpha/r B A) and write a plain "
               "Hugging Face model; without it a LoRA checkpoint is written as a PEFT adapter folder "
               "(adapter_config.json + adapter_model.safetensors)");
  ex->add_flag("--model-only", xa->model_only,
               "write config.json and model.safetensors only, without the tokenizer files (by default the "
               "checkpoint's tokenizer goes with the model, and its absence is an error)");
  ex->add_option("--dtype", xa->dtype, "float32 or bfloat16 (also fp32, bf16)")->capture_default_str()->check(
      CLI::IsMember({"float32", "bfloat16", "fp32", "bf16"}));
  ex->callback([xa] { app::run_export(*xa); });
}

}  // namespace snip::cli
