// Cost-table JSON (`snip plan --costs F`) -> io::parse_json ->
// plan::parse_cost_table -> make_problem at both granularities; a table
// that parses must survive to_json -> parse_cost_table unchanged in size.
#include "harness.h"
#include "snip/io/json.h"
#include "snip/plan/cost_table.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::guarded(data, size, [](std::string_view in) {
    const plan::CostTable t = plan::parse_cost_table(io::parse_json(in, "costs.json"), "costs.json");
    const plan::CostTable back = plan::parse_cost_table(plan::to_json(t), "round trip");
    if (back.layers.size() != t.layers.size() || back.per_gemm() != t.per_gemm())
      fuzz::finding("cost table round trip changed the table");
    for (plan::Granularity g : {plan::Granularity::layer, plan::Granularity::gemm}) {
      try {
        plan::make_problem(t, g);
      } catch (const UserError&) {
      }
    }
  });
  return 0;
}
