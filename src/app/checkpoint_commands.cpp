// src/app/checkpoint_commands.cpp: `snip train`'s summary, `snip eval`,
// `snip export` and `snip sample`
// (snip/app/checkpoint_commands.h).
#include "snip/app/checkpoint_commands.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

#include "tokenizer_check.h"
#include "snip/config/config.h"
#include "snip/core/error.h"
#include "snip/data/data_folder.h"
#include "snip/hw/platform.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/model/hf.h"
#include "snip/model/lora.h"
#include "snip/data/token_client.h"
#include "snip/run/trainer_state.h"
#include "snip/train/checkpoint.h"
#include "snip/train/sample.h"
#include "snip/train/memory.h"
#include "snip/train/trainer.h"

namespace snip::app {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

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

}  // namespace

void print_train_summary(const TrainSummary& s, std::ostream& out) {
  out << fmt::format(
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
      out << fmt::format(
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
}

namespace {

// A --run-dir given to a command that reads a run (eval, export, sample):
// UserError "--run-dir: DIR does not exist" or "... is not a run of `snip
// train` (it has no config.toml)"; nothing when `run_dir` is "".
void check_run_dir(const std::string& run_dir) {
  if (run_dir.empty()) return;
  if (fs::exists(run_dir) && !fs::is_directory(run_dir))
    throw UserError("--run-dir: " + run_dir + " is a file, not a run folder");
  if (!fs::is_directory(run_dir)) throw UserError("--run-dir: " + run_dir + " does not exist");
  if (!fs::is_regular_file(fs::path(run_dir) / "config.toml"))
    throw UserError("--run-dir: " + run_dir + " is not a run of `snip train` (it has no config.toml)");
}

// The checkpoint eval and export read: --checkpoint, else --run-dir's newest
// complete one (UserError when neither is given, or the run has none).
std::string checkpoint_to_read(const std::string& run_dir, const std::string& checkpoint) {
  if (!checkpoint.empty()) return checkpoint;
  if (run_dir.empty()) fail("give --run-dir or --checkpoint");
  const std::string ckpt = latest_checkpoint(run_dir);
  if (ckpt.empty()) fail("no complete checkpoint in ", run_dir, "/checkpoints");
  return ckpt;
}

}  // namespace

void run_eval(const EvalRequest& r) {
  check_run_dir(r.run_dir);
  if (r.batch < 1) fail("--batch-size: expected an integer >= 1, got ", r.batch);
  if (r.batches < 0) fail("--batches: expected an integer >= 0 (0 = the whole validation split), got ", r.batches);
  if (r.seq < 0) fail("--seq-len: expected an integer >= 1 (0 or absent = what the model trained on), got ", r.seq);
  Config cfg;
  if (!r.run_dir.empty()) {
    const std::string saved = (fs::path(r.run_dir) / "config.toml").string();
    if (fs::exists(saved)) cfg.load_toml_file(saved);
  }
  const std::string ckpt = checkpoint_to_read(r.run_dir, r.checkpoint);
  // A snip checkpoint (trainer_state.json) or a Hugging Face folder.
  const bool hf = is_hf_folder(ckpt);
  if (hf && r.data.empty() && r.run_dir.empty())
    fail("--checkpoint ", ckpt, " is a Hugging Face folder: give the data to evaluate on with --data");
  // A snip checkpoint's trainer_state.json, verified once (verify_checkpoint
  // reads every file of the checkpoint, the weights included).
  const json st = hf ? json() : verify_checkpoint(ckpt);
  // The data: --data, else the run's data.dir, else (a checkpoint alone)
  // the data folder the checkpoint was trained on.
  std::string data = r.data;
  if (data.empty() && r.run_dir.empty() && !hf) data = checkpoint_data_dir(st);
  if (data.empty()) data = cfg.get_string("data.dir");
  const std::string val = (fs::path(data) / "val.bin").string();
  if (!fs::exists(val)) {
    if (!r.data.empty()) fail("--data: ", val, " does not exist");
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
  else if (other_tokenizer(data, info.tokenizer_sha256, model_tok_from, model_tok, r.allow_other_tokenizer,
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
  int64_t T = r.seq;
  std::string T_from = "--seq-len";
  if (T <= 0) {
    const fs::path export_info = fs::path(ckpt) / "snip_export.json";
    if (!r.run_dir.empty() && cfg.get_int("train.seq_len") > 0) {
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
  if (!r.logits_out.empty()) {
    const EvalBatch e = first_eval_batch(model, val, r.batch, T);
    io::SafeTensors st;
    st.metadata["format"] = "pt";
    st.metadata["source"] = "snip eval --logits-out: first micro-batch of " + val;
    st.add("input_ids", io::DType::I64, {e.input_ids.size(0), e.input_ids.size(1)}, e.input_ids.data_ptr());
    st.add("logits", io::DType::F32, {e.logits.size(0), e.logits.size(1), e.logits.size(2)}, e.logits.data_ptr());
    io::write_safetensors(r.logits_out, st);
  }
  EvalCoverage cov;
  const double loss = evaluate(model, val, r.batch, T, r.batches, &cov);
  const std::string part =
      cov.windows == cov.windows_total
          ? fmt::format("all {} micro-batches ({} windows of {} tokens: {})", cov.batches, cov.windows, T, T_from)
          : fmt::format("{} of {} micro-batches ({} of {} windows of {} tokens: {}; --batches 0 evaluates all)",
                        cov.batches, cov.batches_total, cov.windows, cov.windows_total, T, T_from);
  // The precision: FP32 GEMMs, no quantizer (a run's own evaluations use
  // its precision at that step, e.g. FP8 in the final phase, and BF16 GEMMs).
  std::cout << fmt::format("{}: val loss {:.4f} nats/token, perplexity {:.2f}, over {} of {}; FP32 GEMMs, "
                           "unquantized\n", ckpt, loss, std::exp(loss), part, val);
}

void run_export(const ExportRequest& r) {
  check_run_dir(r.run_dir);
  const std::string ckpt = checkpoint_to_read(r.run_dir, r.checkpoint);
  LlamaForCausalLM model = load_checkpoint_model(ckpt);
  const json st = verify_checkpoint(ckpt);  // once: it reads every file of the checkpoint
  if (has_lora(model) && !r.merge) {
    // A PEFT adapter folder over the base the checkpoint names (checked by SHA-256 in load_checkpoint_model).
    const LoraCheckpoint b = lora_checkpoint_base(ckpt, st, "checkpoint " + ckpt);
    export_peft(model, b.config, b.dir, r.out, r.force,
                r.dtype == "bfloat16" || r.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
    std::cout << "wrote " << r.out << "/adapter_config.json and " << r.out
              << "/adapter_model.safetensors (PEFT LoRA adapters over " << b.dir
              << "; snip export --merge writes the merged model)\n";
    return;
  }
  if (r.merge) {
    if (!has_lora(model)) fail("--merge: ", ckpt, " holds no LoRA adapters (lora.rank was 0): export it without --merge");
    merge_lora(model);
  }
  // The tokenizer goes with the model: the checkpoint's own (or, for a
  // checkpoint of an earlier snip, its data folder's). None is an error,
  // not a warning: a model folder without its tokenizer is not usable on
  // its own. --model-only says that is what the user wants.
  std::optional<HfTokenizer> tok;
  if (!r.model_only) {
    try {
      tok = checkpoint_tokenizer(ckpt, st);
    } catch (const UserError& e) {
      fail(e.what(), " (snip export --model-only writes the model without a tokenizer)");
    }
  }
  const bool bf16 = r.dtype == "bfloat16" || r.dtype == "bf16";
  // Where the folder came from, and the windows it trained on (snip eval's
  // default --seq-len for it). transformers ignores the file.
  nlohmann::json info = {{"format", "snip-export"}, {"version", 1},
                         {"checkpoint", fs::absolute(ckpt).lexically_normal().string()},
                         {"step", st.value("step", nlohmann::json())},
                         {"val_loss", st.value("val_loss", nlohmann::json())}};
  const int64_t seq_len = checkpoint_seq_len(ckpt, st);
  if (seq_len > 0) info["train_seq_len"] = seq_len;
  export_hf(model, r.out, bf16 ? at::kBFloat16 : at::kFloat, r.force, tok ? &*tok : nullptr,
            {{"snip_export.json", info.dump(2) + "\n"}});
  std::cout << "wrote " << r.out << "/: config.json, model.safetensors, "
            << (tok ? "tokenizer.model, tokenizer_config.json, special_tokens_map.json, " : "")
            << "snip_export.json (where it came from)\n";
}

void run_sample(const SampleRequest& r) {
  SampleOptions o = r.o;
  if (r.seed < 0) fail("--seed: expected an integer >= 0, got ", r.seed);
  o.seed = uint64_t(r.seed);
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    fail("--temperature: expected a finite number >= 0 (0 = greedy), got ", o.temperature);
  if (o.top_k < 0) fail("--top-k: expected an integer >= 0 (0 = every token), got ", o.top_k);
  if (o.max_new_tokens < 0) fail("--max-new-tokens: expected an integer >= 0, got ", o.max_new_tokens);
  if (o.max_new_tokens > kMaxNewTokens)
    fail("--max-new-tokens: expected at most ", kMaxNewTokens, ", got ", o.max_new_tokens);
  if (r.run_dir.empty() && r.checkpoint.empty()) fail("give --run-dir or --checkpoint");
  // A snip checkpoint (trainer_state.json) or a Hugging Face folder, as `snip eval` reads them.
  const fs::path given(r.checkpoint);
  const bool hf = !r.checkpoint.empty() && is_hf_folder(r.checkpoint);
  check_run_dir(r.run_dir);
  const fs::path run(r.run_dir);
  std::string ckpt = r.checkpoint.empty() ? latest_checkpoint(r.run_dir) : r.checkpoint;
  if (ckpt.empty()) fail("--run-dir: no complete checkpoint in ", (run / "checkpoints").string());
  // The tokenizer: --tokenizer, else a Hugging Face folder's own, else the
  // checkpoint's (checkpoint_tokenizer: its own copy, or for an older
  // checkpoint its data folder's). meta.json beside a prepared tokenizer
  // (or the checkpoint's record) names EOS, where a sample stops.
  std::string tok = r.tokenizer;
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
  const std::vector<int32_t> prompt = client.encode(r.prompt, /*bos=*/true);
  // Ids beyond the model's vocabulary would decode to nothing or fail.
  for (int32_t id : prompt)
    if (id >= model->cfg.vocab_size)
      fail("tokenizer ", tok, " gives id ", id, " but the model in ", ckpt, " has ", model->cfg.vocab_size,
           " (another tokenizer than the model's?)");
  if (tok_vocab > model->cfg.vocab_size)
    fail("tokenizer ", tok, " has ", tok_vocab, " pieces but the model in ", ckpt, " only ",
         model->cfg.vocab_size, " (another tokenizer than the model's?)");
  o.eos_id = eos_id;
  o.vocab_limit = tok_vocab;  // the tokenizer's ids only (-1: unknown, all of the model's)
  if (hf) {
    const nlohmann::json& c = read_hf_folder(ckpt).config_json;
    if (c.contains("eos_token_id") && c["eos_token_id"].is_number_integer()) o.eos_id = c["eos_token_id"].get<int64_t>();
  }
  const std::vector<int32_t> ids = sample(model, prompt, o);
  std::cout << client.decode(ids) << "\n";
}

}  // namespace snip::app
