// `snip train`, `snip eval`, `snip export`.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "commands.h"
#include "snip/app/tokenizer_check.h"
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

// What a finished run folder holds, for the end-of-run summary:
// "report.html, metrics.jsonl, summary.json, checkpoints/ (2), plans/ (5), stats/ (3)".
std::string run_contents(const std::string& run_dir) {
  const fs::path r(run_dir);
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  for (const char* f : {"report.html", "metrics.jsonl", "summary.json", "config.toml"})
    if (fs::is_regular_file(r / f)) add(f);
  for (const char* d : {"checkpoints", "plans", "stats"}) {
    if (!fs::is_directory(r / d)) continue;
    size_t n = 0;
    if (std::string(d) == "checkpoints")  // complete ones only (not a step-N.tmp a write left)
      n = complete_checkpoints((r / d).string(), /*warn=*/false).size();
    else
      for (const auto& e : fs::directory_iterator(r / d)) n += e.path().filename().string().rfind("step-", 0) == 0;
    add(fmt::format("{}/ ({})", d, n));
  }
  return out;
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
    std::cout << fmt::format(
        "{}summary: {} steps{}, {} tokens in {:.1f} s ({:.0f} tokens/s)\n"
        "         train loss {:.4f} (mean of the last {} step{}) | val loss {:.4f} (perplexity {}) | best val {:.4f}"
        "{} | {}-token windows\n"
        "         run directory {}: {}\n",
        spdlog::should_log(spdlog::level::info) ? "\n" : "", s.steps,
        (s.start_step == 0 ? std::string()
                           : fmt::format(" ({} in this session, resumed at step {})", s.invocation_steps,
                                         s.start_step)) +
            (s.guard_events == 0
                 ? std::string()
                 : fmt::format(" (guard: {} event{}, {} rollback{}, {} step{} skipped; metrics.jsonl \"guard\")",
                               s.guard_events, s.guard_events == 1 ? "" : "s", s.rollbacks, s.rollbacks == 1 ? "" : "s",
                               s.skipped_steps, s.skipped_steps == 1 ? "" : "s")),
        s.tokens, s.seconds, s.tokens_per_s,
        s.final_train_loss, s.train_loss_steps, s.train_loss_steps == 1 ? "" : "s", s.final_val_loss,
        // a diverged run's perplexity in 3 significant digits, not 46 (1.82e+45)
        fmt::format(std::exp(s.final_val_loss) < 1e6 ? "{:.1f}" : "{:.3g}", std::exp(s.final_val_loss)),
        s.best_val_loss,
        std::isfinite(s.init_val_loss) ? fmt::format(" | at step 0 (--init-from) {:.4f}", s.init_val_loss) : "",
        s.eval_seq_len, s.run_dir,
        run_contents(s.run_dir));
    // Pipeline stages: the layout and what it cost (summary.json "pipeline").
    try {
      const nlohmann::json sum = io::parse_json(io::read_file((fs::path(s.run_dir) / "summary.json").string()), "summary.json");
      const nlohmann::json& pp = sum.value("pipeline", nlohmann::json());
      if (pp.is_object()) {
        const auto b = pp.at("bounds").get<std::vector<int64_t>>();
        std::string blocks;
        for (size_t k = 0; k + 1 < b.size(); ++k) blocks += (k ? " / " : "") + std::to_string(b[k + 1] - b[k]);
        std::cout << fmt::format(
            "         pipeline: {} stages x {} replica(s), {}, {} micro-batches, blocks {} | bubble {} (ideal {:.3f}) "
            "| estimated imbalance {:.3f} | {} bytes per step at the boundaries ({})\n",
            pp.at("stages").get<int>(), pp.at("replicas").get<int>(), pp.at("schedule").get<std::string>(),
            pp.at("micro_batches").get<int64_t>(), blocks,
            pp.at("bubble").is_number() ? fmt::format("{:.3f}", pp.at("bubble").get<double>()) : std::string("-"),
            pp.at("ideal_bubble").get<double>(), pp.at("stage_imbalance").get<double>(),
            pp.at("boundary_bytes_per_step").get<int64_t>(), pp.at("boundary_comm").get<std::string>());
      }
    } catch (const std::exception&) {  // no summary, or an older one: nothing more to say
    }
  });

  struct EvalArgs {
    std::string run_dir, checkpoint, data, logits_out;
    int64_t batches = 0, batch = 16, seq = 0;
    bool allow_other_tokenizer = false;
  };
  auto ea = std::make_shared<EvalArgs>();
  CLI::App* ev = app.add_subcommand("eval", "validation loss and perplexity of a checkpoint");
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
  ev->callback([ea] {
    check_run_dir(ea->run_dir);
    Config cfg;
    if (!ea->run_dir.empty()) {
      const std::string saved = (fs::path(ea->run_dir) / "config.toml").string();
      if (fs::exists(saved)) cfg.load_toml_file(saved);
    }
    std::string ckpt = ea->checkpoint;
    if (ckpt.empty()) {
      if (ea->run_dir.empty()) fail("give --run-dir or --checkpoint");
      ckpt = latest_checkpoint(ea->run_dir);
      if (ckpt.empty()) fail("no complete checkpoint in ", ea->run_dir, "/checkpoints");
    }
    // A snip checkpoint (trainer_state.json) or a Hugging Face folder.
    const bool hf = is_hf_folder(ckpt);
    if (hf && ea->data.empty() && ea->run_dir.empty())
      fail("--checkpoint ", ckpt, " is a Hugging Face folder: give the data to evaluate on with --data");
    // A snip checkpoint's trainer_state.json, verified once (verify_checkpoint
    // reads every file of the checkpoint, the weights included).
    const json st = hf ? json() : verify_checkpoint(ckpt);
    // The data: --data, else the run's data.dir, else (a checkpoint alone)
    // the data folder the checkpoint was trained on.
    std::string data = ea->data;
    if (data.empty() && ea->run_dir.empty() && !hf) data = checkpoint_data_dir(st);
    if (data.empty()) data = cfg.get_string("data.dir");
    const std::string val = (fs::path(data) / "val.bin").string();
    if (!fs::exists(val)) {
      if (!ea->data.empty()) fail("--data: ", val, " does not exist");
      fail(val, " does not exist: the data folder the model was trained on has moved or gone; give the data to "
           "evaluate on with --data DIR");
    }
    const data::DataFolderInfo info = data::verify_data_folder(data, "--data");
    // The model's tokenizer: recorded in the checkpoint, or the HF folder's
    // own tokenizer.model. Another one makes the loss meaningless.
    std::string model_tok, model_tok_from;
    if (hf) {
      const fs::path t = fs::path(ckpt) / "tokenizer.model";
      if (fs::is_regular_file(t)) {
        model_tok = data::sha256_hex(io::read_file(t.string()));
        model_tok_from = t.string();
      }
    } else {
      model_tok = checkpoint_tokenizer_sha256(st);
      model_tok_from = ckpt;
    }
    if (model_tok.empty())
      spdlog::warn("{} does not say which tokenizer the model was trained with: the data's tokenizer cannot be "
                   "checked", ckpt);
    else if (app::other_tokenizer(data, info.tokenizer_sha256, model_tok_from, model_tok, ea->allow_other_tokenizer,
                             "the loss would be meaningless; evaluate on data prepared"))
      spdlog::warn("--allow-other-tokenizer: the data's tokenizer is not the model's");
    // A Hugging Face folder's weights, before any is allocated: the memory
    // they need (a checkpoint folder is checked inside load_checkpoint_model).
    if (hf)
      check_memory(inference_memory(read_hf_folder(ckpt).config, 0, 0), hw::available_memory_bytes(),
                   "snip eval --checkpoint " + ckpt);
    LlamaForCausalLM model = hf ? import_hf(ckpt) : load_checkpoint_model(ckpt);
    // The windows: --seq-len, else those the model trained on (the run's
    // train.seq_len, or snip_export.json beside an exported folder), so that
    // the loss compares with the run's own evaluations.
    int64_t T = ea->seq;
    std::string T_from = "--seq-len";
    if (T <= 0) {
      const fs::path export_info = fs::path(ckpt) / "snip_export.json";
      if (!ea->run_dir.empty() && cfg.get_int("train.seq_len") > 0) {
        T = cfg.get_int("train.seq_len");
        T_from = "the run's train.seq_len";
      } else if (const int64_t trained = hf ? -1 : checkpoint_seq_len(ckpt, st); trained > 0) {
        T = trained;
        T_from = "the run's train.seq_len";
      } else if (hf && fs::is_regular_file(export_info)) {
        const nlohmann::json j = io::read_json_file(export_info.string(), "snip_export.json");
        if (j.contains("train_seq_len") && j["train_seq_len"].is_number_integer() && j["train_seq_len"].get<int64_t>() > 0) {
          T = j["train_seq_len"].get<int64_t>();
          T_from = "the training's train.seq_len in " + export_info.string();
        }
      }
      if (T <= 0) {
        T = std::min<int64_t>(256, model->cfg.max_position_embeddings);
        T_from = "the folder does not say its training length; --seq-len to choose";
      }
    }
    if (int64_t(info.vocab_size) > model->cfg.vocab_size)
      fail("--data ", data, ": vocabulary ", info.vocab_size, " is larger than the model's ", model->cfg.vocab_size,
           " (", ckpt, "): its ids have no embedding");
    if (!ea->logits_out.empty()) {
      const EvalBatch e = first_eval_batch(model, val, ea->batch, T);
      io::SafeTensors st;
      st.metadata["format"] = "pt";
      st.metadata["source"] = "snip eval --logits-out: first micro-batch of " + val;
      st.add("input_ids", io::DType::I64, {e.input_ids.size(0), e.input_ids.size(1)}, e.input_ids.data_ptr());
      st.add("logits", io::DType::F32, {e.logits.size(0), e.logits.size(1), e.logits.size(2)}, e.logits.data_ptr());
      io::write_safetensors(ea->logits_out, st);
    }
    EvalCoverage cov;
    const double loss = evaluate(model, val, ea->batch, T, ea->batches, &cov);
    const std::string part =
        cov.windows == cov.windows_total
            ? fmt::format("all {} micro-batches ({} windows of {} tokens: {})", cov.batches, cov.windows, T, T_from)
            : fmt::format("{} of {} micro-batches ({} of {} windows of {} tokens: {}; --batches 0 evaluates all)",
                          cov.batches, cov.batches_total, cov.windows, cov.windows_total, T, T_from);
    // The precision: FP32 GEMMs, no quantizer (a run's own evaluations use
    // its precision at that step, e.g. FP8 in the final phase, and BF16 GEMMs).
    std::cout << fmt::format("{}: val loss {:.4f} nats/token, perplexity {:.2f}, over {} of {}; FP32 GEMMs, "
                             "unquantized\n", ckpt, loss, std::exp(loss), part, val);
  });

  struct ExportArgs {
    std::string run_dir, checkpoint, out, dtype = "float32";
    bool force = false, merge = false, model_only = false;
  };
  auto xa = std::make_shared<ExportArgs>();
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
  ex->callback([xa] {
    check_run_dir(xa->run_dir);
    std::string ckpt = xa->checkpoint;
    if (ckpt.empty()) {
      if (xa->run_dir.empty()) fail("give --run-dir or --checkpoint");
      ckpt = latest_checkpoint(xa->run_dir);
      if (ckpt.empty()) fail("no complete checkpoint in ", xa->run_dir, "/checkpoints");
    }
    LlamaForCausalLM model = load_checkpoint_model(ckpt);
    const json st = verify_checkpoint(ckpt);  // once: it reads every file of the checkpoint
    if (has_lora(model) && !xa->merge) {
      // A PEFT adapter folder over the base the checkpoint names (checked by SHA-256 in load_checkpoint_model).
      const LoraCheckpoint b = lora_checkpoint_base(ckpt, st, "checkpoint " + ckpt);
      export_peft(model, b.config, b.dir, xa->out, xa->force,
                  xa->dtype == "bfloat16" || xa->dtype == "bf16" ? at::kBFloat16 : at::kFloat);
      std::cout << "wrote " << xa->out << "/adapter_config.json and " << xa->out
                << "/adapter_model.safetensors (PEFT LoRA adapters over " << b.dir
                << "; snip export --merge writes the merged model)\n";
      return;
    }
    if (xa->merge) {
      if (!has_lora(model)) fail("--merge: ", ckpt, " holds no LoRA adapters (lora.rank was 0): export it without --merge");
      merge_lora(model);
    }
    // The tokenizer goes with the model: the checkpoint's own (or, for a
    // checkpoint of an earlier snip, its data folder's). None is an error,
    // not a warning: a model folder without its tokenizer is not usable on
    // its own. --model-only says that is what the user wants.
    std::optional<HfTokenizer> tok;
    if (!xa->model_only) {
      try {
        tok = checkpoint_tokenizer(ckpt, st);
      } catch (const UserError& e) {
        fail(e.what(), " (snip export --model-only writes the model without a tokenizer)");
      }
    }
    const bool bf16 = xa->dtype == "bfloat16" || xa->dtype == "bf16";
    // Where the folder came from, and the windows it trained on (snip eval's
    // default --seq-len for it). transformers ignores the file.
    nlohmann::json info = {{"format", "snip-export"}, {"version", 1},
                           {"checkpoint", fs::absolute(ckpt).lexically_normal().string()},
                           {"step", st.value("step", nlohmann::json())},
                           {"val_loss", st.value("val_loss", nlohmann::json())}};
    const int64_t seq_len = checkpoint_seq_len(ckpt, st);
    if (seq_len > 0) info["train_seq_len"] = seq_len;
    export_hf(model, xa->out, bf16 ? at::kBFloat16 : at::kFloat, xa->force, tok ? &*tok : nullptr,
              {{"snip_export.json", info.dump(2) + "\n"}});
    std::cout << "wrote " << xa->out << "/: config.json, model.safetensors, "
              << (tok ? "tokenizer.model, tokenizer_config.json, special_tokens_map.json, " : "")
              << "snip_export.json (where it came from)\n";
  });
}

}  // namespace snip::cli
