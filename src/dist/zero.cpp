// ZeRO stages 1 and 2 (see zero.h).
#include "snip/dist/zero.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/run/checkpoint_files.h"
#include "snip/core/error.h"

namespace snip::dist {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<torch::Tensor> ZeroPartition::owned(int rank) const {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i)
    if (owner[i] == rank) out.push_back(params[i]);
  return out;
}

ZeroPartition zero_partition(const std::vector<std::string>& names, const std::vector<torch::Tensor>& params,
                             int world) {
  if (world < 1) throw std::invalid_argument("zero_partition: world size must be >= 1");
  if (names.size() != params.size()) throw std::invalid_argument("zero_partition: names and params differ in length");
  ZeroPartition part;
  part.world = world;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i)
    if (seen.insert(params[i].unsafeGetTensorImpl()).second) {
      part.names.push_back(names[i]);
      part.params.push_back(params[i]);
    }
  const size_t P = part.params.size();
  std::vector<size_t> order(P);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return part.params[a].numel() > part.params[b].numel(); });
  part.owner.assign(P, 0);
  part.elements.assign(size_t(world), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(part.elements.begin(), part.elements.end()) - part.elements.begin());
    part.owner[i] = r;
    part.elements[size_t(r)] += part.params[i].numel();
  }
  part.offset.assign(P, 0);
  std::vector<int64_t> at(size_t(world), 0);
  for (size_t i = 0; i < P; ++i) {
    part.offset[i] = at[size_t(part.owner[i])];
    at[size_t(part.owner[i])] += part.params[i].numel();
  }
  return part;
}

namespace {

// The indices of the parameters `r` owns (model order).
std::vector<size_t> owned_indices(const ZeroPartition& part, int r) {
  std::vector<size_t> out;
  for (size_t i = 0; i < part.params.size(); ++i)
    if (part.owner[i] == r) out.push_back(i);
  return out;
}

}  // namespace

void reduce_gradients_to_owners(Communicator& comm, const ZeroPartition& part) {
  torch::NoGradGuard ng;
  const int me = comm.rank();
  for (int o = 0; o < part.world; ++o) {
    const std::vector<size_t> idx = owned_indices(part, o);
    if (idx.empty()) continue;
    std::vector<torch::Tensor> flat;
    for (size_t i : idx) {
      const torch::Tensor& p = part.params[i];
      flat.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
    }
    torch::Tensor buf = torch::cat(flat);
    comm.reduce_sum(buf, o);
    int64_t off = 0;
    for (size_t i : idx) {
      torch::Tensor p = part.params[i];
      const int64_t n = p.numel();
      if (me == o) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        p.mutable_grad().view({-1}).copy_(buf.narrow(0, off, n));
      } else {
        p.mutable_grad() = torch::Tensor();
      }
      off += n;
    }
  }
}

double zero_clip_grad_norm(Communicator* comm, const ZeroPartition& part, double max_norm) {
  torch::NoGradGuard ng;
  const int me = comm ? comm->rank() : 0;
  const size_t P = part.params.size();
  if (P == 0) return 0.0;
  // clip_grad_norm_ stacks the norms of the parameters that have a gradient;
  // on one rank that is every parameter after the reductions (they fill
  // missing gradients with zeros), so the [P] vector matches its stack.
  torch::Tensor norms = torch::zeros({int64_t(P)}, part.params[0].options().dtype(torch::kFloat));
  for (size_t i = 0; i < P; ++i)
    if (part.owner[i] == me && part.params[i].grad().defined())
      norms[int64_t(i)].copy_(part.params[i].grad().data().norm(2.0));
  if (comm) {
    std::vector<torch::Tensor> v{norms};
    comm->allreduce_sum(v);
  }
  const torch::Tensor total = P == 1 ? norms[0] : norms.norm(2.0);
  const torch::Tensor clip = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (size_t i = 0; i < P; ++i)
    if (part.owner[i] == me && part.params[i].grad().defined()) part.params[i].grad().data().mul_(clip);
  return total.item().toDouble();
}

void broadcast_from_owners(Communicator& comm, const ZeroPartition& part) {
  torch::NoGradGuard ng;
  const int me = comm.rank();
  for (int o = 0; o < part.world; ++o) {
    const std::vector<size_t> idx = owned_indices(part, o);
    if (idx.empty()) continue;
    torch::Tensor buf;
    if (me == o) {
      std::vector<torch::Tensor> flat;
      for (size_t i : idx) flat.push_back(part.params[i].detach().reshape({-1}));
      buf = torch::cat(flat);
    } else {
      buf = torch::empty({part.elements[size_t(o)]}, part.params[idx[0]].options().requires_grad(false));
    }
    comm.broadcast(buf, o);
    if (me == o) continue;
    int64_t off = 0;
    for (size_t i : idx) {
      const int64_t n = part.params[i].numel();
      part.params[i].detach().view({-1}).copy_(buf.narrow(0, off, n));
      off += n;
    }
  }
}

// ---------------------------------------------------------------------------

bool get_adam_entry(const torch::optim::AdamW& opt, const torch::Tensor& param, AdamEntry& out) {
  // LibTorch keys the state by the TensorImpl address (optim/adamw.cpp).
  const auto it = opt.state().find(param.unsafeGetTensorImpl());
  if (it == opt.state().end()) return false;
  const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
  out.exp_avg = s.exp_avg();
  out.exp_avg_sq = s.exp_avg_sq();
  out.step = s.step();
  return true;
}

void set_adam_entry(torch::optim::AdamW& opt, const torch::Tensor& param, const AdamEntry& e) {
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(e.step);
  s->exp_avg(e.exp_avg.clone());
  s->exp_avg_sq(e.exp_avg_sq.clone());
  opt.state()[param.unsafeGetTensorImpl()] = std::move(s);
}

std::string optimizer_shard_name(int rank) { return "optimizer-rank" + std::to_string(rank) + ".safetensors"; }

namespace {

io::TensorRecord record(const std::string& name, const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU).contiguous();  // AdamW state on a GPU (dist.backend = nccl) comes to the host
  io::TensorRecord r;
  r.name = name;
  r.dtype = c.scalar_type() == torch::kLong ? io::DType::I64 : io::DType::F32;
  r.shape = c.sizes().vec();
  r.data.resize(size_t(c.numel()) * c.element_size());
  if (!r.data.empty()) std::memcpy(r.data.data(), c.data_ptr(), r.data.size());
  return r;
}

}  // namespace

std::string optimizer_shard_bytes(const torch::optim::AdamW& opt, const ZeroPartition& part, int rank) {
  io::SafeTensors st;
  st.metadata["format"] = "snip-optimizer-shard";
  st.metadata["rank"] = std::to_string(rank);
  st.metadata["world_size"] = std::to_string(part.world);
  for (size_t i = 0; i < part.params.size(); ++i) {
    AdamEntry e;
    if (part.owner[i] != rank || !get_adam_entry(opt, part.params[i], e)) continue;
    st.tensors.push_back(record(part.names[i] + ".exp_avg", e.exp_avg.to(torch::kFloat)));
    st.tensors.push_back(record(part.names[i] + ".exp_avg_sq", e.exp_avg_sq.to(torch::kFloat)));
    st.tensors.push_back(record(part.names[i] + ".step", torch::full({1}, e.step, torch::kLong)));
  }
  return io::serialize_safetensors(st);
}

json optimizer_index(const ZeroPartition& part, int zero_stage) {
  json files = json::array();
  for (int r = 0; r < part.world; ++r) files.push_back(optimizer_shard_name(r));
  json params = json::object();
  for (size_t i = 0; i < part.params.size(); ++i)
    params[part.names[i]] = {{"owner", part.owner[i]}, {"shape", part.params[i].sizes().vec()},
                             {"offset", part.offset[i]}, {"numel", part.params[i].numel()}};
  return {{"format", "snip-optimizer-index"}, {"version", 1}, {"world_size", part.world},
          {"zero_stage", zero_stage}, {"files", files}, {"params", params}};
}

void load_optimizer_shards(const std::string& dir, const json& crc, torch::optim::AdamW& opt,
                           const ZeroPartition& part, int64_t step) {
  const std::string ip = (fs::path(dir) / "optimizer_index.json").string();
  if (!fs::is_regular_file(ip)) fail("checkpoint ", dir, ": missing file optimizer_index.json");
  const json idx = io::parse_json(io::read_file(ip), "checkpoint " + ip);
  if (!idx.is_object() || idx.value("format", json()) != "snip-optimizer-index" || idx.value("version", json()) != 1 ||
      !idx.contains("files") || !idx["files"].is_array() || !idx.contains("params") || !idx["params"].is_object())
    fail("checkpoint ", ip, ": expected {\"format\": \"snip-optimizer-index\", \"version\": 1, \"files\", "
         "\"params\"} (corrupt)");
  const json& files = idx["files"];
  const json& ps = idx["params"];
  // Every parameter of the model named, and nothing else.
  std::unordered_set<std::string> model_names(part.names.begin(), part.names.end());
  for (auto& [name, e] : ps.items())
    if (!model_names.count(name))
      fail("checkpoint ", ip, ": names parameter '", name.substr(0, 80), "', which the model does not have "
           "(another model, or corrupt)");
  // The parameters `opt` holds: this rank's share under ZeRO, all at stage 0.
  std::unordered_set<const c10::TensorImpl*> held;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params()) held.insert(p.unsafeGetTensorImpl());
  std::map<int64_t, io::SafeTensors> shards;  // read once each, on demand
  auto shard = [&](int64_t owner) -> const io::SafeTensors& {
    auto it = shards.find(owner);
    if (it != shards.end()) return it->second;
    if (owner < 0 || owner >= int64_t(files.size()) || !files[size_t(owner)].is_string())
      fail("checkpoint ", ip, ": owner rank ", owner, " has no file in \"files\" (corrupt)");
    const std::string name = files[size_t(owner)].get<std::string>();
    if (name != optimizer_shard_name(int(owner)))
      fail("checkpoint ", ip, ": files[", owner, "] is '", name.substr(0, 80), "', expected ",
           optimizer_shard_name(int(owner)), " (corrupt)");
    const std::string fp = (fs::path(dir) / name).string();
    if (!fs::is_regular_file(fp)) fail("checkpoint ", fp, ": missing (the optimizer shard of rank ", owner, ")");
    const std::string bytes = io::read_file(fp);
    const json c = crc.is_object() && crc.contains(name) ? crc[name] : json();
    if (!c.is_number_unsigned() || c.get<uint64_t>() != crc32_of(bytes))
      fail("checkpoint ", fp, ": checksum mismatch (the file is truncated or corrupted)");
    try {
      return shards.emplace(owner, io::parse_safetensors(bytes, fp)).first->second;
    } catch (const UserError& e) {
      fail("checkpoint ", fp, ": ", e.what());
    }
  };
  for (size_t i = 0; i < part.params.size(); ++i) {
    const torch::Tensor& p = part.params[i];
    if (!held.count(p.unsafeGetTensorImpl())) continue;
    const std::string& name = part.names[i];
    if (!ps.contains(name)) fail("checkpoint ", ip, ": parameter '", name, "' is missing (another model, or corrupt)");
    const json& e = ps[name];
    if (!e.is_object() || !e.contains("owner") || !e["owner"].is_number_integer() || !e.contains("shape") ||
        e["shape"] != json(p.sizes().vec()))
      fail("checkpoint ", ip, ": parameter '", name, "': expected its owner and shape ", json(p.sizes().vec()).dump(),
           " (another model, or corrupt)");
    const int64_t owner = e["owner"].get<int64_t>();
    const io::SafeTensors& st = shard(owner);
    const std::string fp = (fs::path(dir) / optimizer_shard_name(int(owner))).string();
    const io::TensorRecord* m = st.find(name + ".exp_avg");
    const io::TensorRecord* v = st.find(name + ".exp_avg_sq");
    const io::TensorRecord* s = st.find(name + ".step");
    if (!m && !v && !s) continue;  // never stepped
    const std::string where = str_cat("checkpoint ", fp, ": parameter '", name, "': ");
    if (!m || !v || !s) fail(where, "expected exp_avg, exp_avg_sq and step together (corrupt)");
    if (s->dtype != io::DType::I64 || s->shape != std::vector<int64_t>{1} || s->data.size() != 8)
      fail(where, "step: expected I64 [1] (corrupt)");
    AdamEntry a;
    std::memcpy(&a.step, s->data.data(), 8);
    if (a.step < 1 || a.step > step) fail(where, "AdamW step ", a.step, " is outside [1, ", step, "] (corrupt)");
    for (auto [rec, out] : {std::pair<const io::TensorRecord*, torch::Tensor*>{m, &a.exp_avg}, {v, &a.exp_avg_sq}}) {
      if (rec->dtype != io::DType::F32 || rec->shape != p.sizes().vec() ||
          rec->data.size() != size_t(p.numel()) * 4)
        fail(where, rec->name.substr(name.size() + 1), ": expected F32 of the parameter's shape ",
             json(p.sizes().vec()).dump(), " (corrupt)");
      *out = torch::empty(p.sizes(), torch::kFloat);
      if (!rec->data.empty()) std::memcpy(out->data_ptr<float>(), rec->data.data(), rec->data.size());
      if (!torch::isfinite(*out).all().item<bool>())
        fail(where, rec->name.substr(name.size() + 1), " holds non-finite values (corrupt)");
    }
    if ((a.exp_avg_sq < 0).any().item<bool>()) fail(where, "exp_avg_sq holds negative values (corrupt)");
    a.exp_avg = a.exp_avg.to(p.options());  // the parameter's dtype and device (train.device)
    a.exp_avg_sq = a.exp_avg_sq.to(p.options());
    set_adam_entry(opt, p, a);
  }
}

void copy_adam_state(const torch::optim::AdamW& from, torch::optim::AdamW& to, const ZeroPartition& part) {
  std::unordered_set<const c10::TensorImpl*> held;
  for (const auto& g : to.param_groups())
    for (const auto& p : g.params()) held.insert(p.unsafeGetTensorImpl());
  for (const torch::Tensor& p : part.params) {
    AdamEntry e;
    if (held.count(p.unsafeGetTensorImpl()) && get_adam_entry(from, p, e)) set_adam_entry(to, p, e);
  }
}

std::unique_ptr<torch::optim::AdamW> gather_adam_state(
    Communicator& comm, const ZeroPartition& part, const torch::optim::AdamW& mine,
    const std::function<std::unique_ptr<torch::optim::AdamW>()>& make_full) {
  torch::NoGradGuard ng;
  std::unique_ptr<torch::optim::AdamW> full = make_full();
  const int me = comm.rank();
  for (size_t i = 0; i < part.params.size(); ++i) {
    const torch::Tensor& p = part.params[i];
    const int o = part.owner[i];
    AdamEntry e;
    const bool has = o == me && get_adam_entry(mine, p, e);
    torch::Tensor step = torch::full({1}, has ? e.step : int64_t{0}, torch::kLong);
    comm.broadcast(step, o);
    const int64_t s = step.item<int64_t>();
    if (s == 0) continue;  // never stepped: no state anywhere
    std::vector<int64_t> shape{2};
    for (int64_t d : p.sizes()) shape.push_back(d);
    torch::Tensor mv = has ? torch::stack({e.exp_avg, e.exp_avg_sq}) : torch::empty(shape, p.options());
    mv = mv.contiguous();
    comm.broadcast(mv, o);
    set_adam_entry(*full, p, AdamEntry{mv[0], mv[1], s});
  }
  return full;
}

RankMemory rank_memory(const std::vector<torch::Tensor>& params, const torch::optim::AdamW& opt) {
  RankMemory m;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const torch::Tensor& p : params) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    m.params += int64_t(p.nbytes());
    if (p.grad().defined()) m.grads += int64_t(p.grad().nbytes());
  }
  for (const auto& [key, s] : opt.state()) {
    const auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(s.get());
    if (!a) continue;
    for (const torch::Tensor& t : {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()})
      if (t.defined()) m.optimizer += int64_t(t.nbytes());
  }
  return m;
}

}  // namespace snip::dist
