// src/app/plan_measure.cpp: the stats step behind `snip plan --config
// MODEL.toml --init-from HF_DIR --data DIR` (src/app/plan_measure.h).
//
// What it measures is what `snip train` measures at a re-plan (docs/method.md
// section 3; snip/method/stats.h): every quantizable layer of the model at
// every option of precision.options, on one micro-batch of --stats-batch
// sequences of train.seq_len tokens, the first of DIR/train.bin in the
// loader's order for train.seed. The optimizer is a fresh AdamW (a
// checkpoint folder has no optimizer state), so WD is the divergence of a
// first AdamW update.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <filesystem>
#include <string>
#include <vector>


#include "plan_measure.h"
#include "tokenizer_check.h"
#include "snip/config/config.h"
#include "snip/data/data_folder.h"
#include "snip/data/loader.h"
#include "snip/hw/platform.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/method/stats.h"
#include "snip/model/hf.h"
#include "snip/model/matmul.h"
#include "snip/plan/cost_table.h"
#include "snip/recipes/recipe_file.h"
#include "snip/train/memory.h"
#include "snip/train/model_session.h"
#include "snip/train/optimizer.h"
#include "snip/train/step.h"
#include "snip/train/trainer.h"
#include "snip/core/error.h"

namespace fs = std::filesystem;

namespace snip::app {

plan::CostTable measure_plan_costs(Config& cfg, const PlanMeasureRequest& r) {
  const HfFolder f = read_hf_folder(r.hf_dir);
  // Notes go to stderr: stdout is the plan (or its JSON).
  for (const std::string& n : adopt_hf_config(f, cfg)) std::cerr << "snip: note: " << n << "\n";
  cfg.validate();
  const RunConfig rc = RunConfig::from(cfg);  // rc.recipes: precision.options may name precision.recipe_file's
  const TrainConfig& tc = rc.train;
  const std::string train_bin = (fs::path(r.data_dir) / "train.bin").string();
  if (!fs::exists(train_bin)) fail("--data: ", train_bin, " does not exist");
  const data::DataFolderInfo info = data::verify_data_folder(r.data_dir, "--data");
  // The folder's tokenizer must be the data's, as for `snip eval`.
  const fs::path tok = fs::path(r.hf_dir) / "tokenizer.model";
  if (fs::is_regular_file(tok)) {
    const std::string sha = data::sha256_hex(io::read_file(tok.string()));
    if (other_tokenizer(r.data_dir, info.tokenizer_sha256, tok.string(), sha, r.allow_other_tokenizer,
                        "Q would be measured on meaningless text; prepare the data"))
      std::cerr << "snip: warning: --allow-other-tokenizer: the data's tokenizer is not the model's\n";
  } else {
    std::cerr << "snip: warning: " << r.hf_dir << " has no tokenizer.model: the data's tokenizer cannot be checked\n";
  }
  if (int64_t(info.vocab_size) > f.config.vocab_size)
    fail("--data ", r.data_dir, ": vocabulary ", info.vocab_size, " is larger than the model's ",
         f.config.vocab_size, " (", r.hf_dir, "): its ids have no embedding");

  ModelSession ms = open_hf_session(rc, r.hf_dir, train_bin, r.batch, "snip plan --init-from");
  LlamaForCausalLM& model = ms.model;
  torch::optim::AdamW* opt = ms.optimizer.get();
  const int64_t B = ms.B, T = ms.T;
  std::vector<int32_t> in, tg;
  ms.loader->next(in, tg);
  const torch::Tensor ids = to_ids(in, B, T), targets = to_ids(tg, B, T);
  model->set_step(uint64_t(tc.seed), 0);

  StatsOptions so;
  so.recipes = rc.recipes;
  so.options.clear();
  for (const std::string& o : rc.precision.options)
    if (o != so.reference) so.options.push_back(o);
  so.low_option = rc.precision.low_option;
  so.alpha = rc.precision.alpha;
  so.first_order = rc.precision.first_order;
  so.curvature_probes = int(rc.precision.curvature_probes);
  so.seed = uint64_t(tc.seed);
  std::string names;
  for (const std::string& o : so.options) names += (names.empty() ? "" : ",") + o;
  std::cerr << "snip: stats step on " << r.hf_dir << " (" << model->linear_layers().size() << " layers, options "
            << names << ") over " << B << " x " << T << " tokens of " << train_bin << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  const StatsStep s = run_stats_step(
      model->linear_layers(), [&] { return LlamaForCausalLMImpl::loss(model(ids), targets); }, *opt, so, 0);
  char took[64];
  std::snprintf(took, sizeof took, "%.1f", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::cerr << "snip: stats step done in " << took << " s\n";
  if (!r.stats_out.empty()) {
    nlohmann::json j = to_json(s, r.per_gemm);
    j["source"] = "snip plan --init-from " + r.hf_dir + " --data " + r.data_dir;
    io::save_json_atomic(j, r.stats_out);
    std::cerr << "snip: statistics written to " << r.stats_out << "\n";
  }
  plan::CostTable t = to_cost_table(s, r.per_gemm);
  t.source = "the stats step on " + r.hf_dir;
  return t;
}

}  // namespace snip::app
