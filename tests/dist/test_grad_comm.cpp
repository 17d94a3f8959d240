// dist/data_parallel.h GradCompressor without other processes: the
// error-feedback bookkeeping (Karimireddy et al. 2019, Algorithm 2), the
// shared-amax quantization and the bytes each format would send. The 2-rank
// runs are tests/cli/test_dist.py (case gradcomm).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "snip/dist/data_parallel.h"
#include "snip/formats/fake_quant.h"
#include "snip/core/error.h"

namespace snip::dist {
namespace {

// g [rows, cols] with entries k * 2^-10, k uniform in [-2048, 2047].
torch::Tensor grid_gradient(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::uniform_int_distribution<int> k(-2048, 2047);
  torch::Tensor g = torch::empty({rows, cols}, torch::kFloat);
  float* p = g.data_ptr<float>();
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = float(k(rng)) / 1024.0f;
  return g;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), size_t(a.numel()) * a.element_size()) == 0;
}

// Over 6 steps of random g, in the order the code computes (data_parallel.h):
//   v_t = fl(g_t + e_{t-1}),  q_t = Q(v_t),  e_t = fl(v_t - q_t).
// (1) Every step q_t + e_t == v_t exactly: the subtraction is exact for
//     every format (q is the format's rounding of v: 0, or within a factor 2
//     of it, Sterbenz).
// (2) Over the run sum_t q_t + e_T == sum_t g_t + sum_t r_t exactly, where
//     r_t = v_t - (g_t + e_{t-1}) is the FP32 rounding of the one addition
//     (all in double, in step order; exact here: the values lie on a binary
//     grid of bounded range).
// (3) With power-of-two scales (bf16, fp8, mxfp4, mxfp8) and g on this grid
//     every r_t is 0, so sum q + e_T == sum g bit for bit; with FP32 scales
//     (fp4/nvfp4's tensor scale, fp8_tensor, int8) q carries a full 24-bit
//     mantissa, g + e can round, and |r_t| <= ulp(v_t) / 2.
void check_bookkeeping(const std::string& format, bool additions_exact) {
  SCOPED_TRACE(format);
  const GradCompressor c(recipes::RecipeSet(), format, /*error_feedback=*/true);
  std::mt19937 rng(12345);
  const int64_t rows = 48, cols = 96;  // several 1x16 / 1x32 blocks, partial 128x128 blocks
  torch::Tensor e = torch::zeros({rows, cols}, torch::kFloat);
  torch::Tensor sum_q = torch::zeros({rows, cols}, torch::kDouble);
  torch::Tensor sum_g = torch::zeros({rows, cols}, torch::kDouble);
  torch::Tensor sum_r = torch::zeros({rows, cols}, torch::kDouble);
  for (int step = 0; step < 6; ++step) {
    const torch::Tensor g = grid_gradient(rng, rows, cols);
    const torch::Tensor e_old = e.clone();
    const torch::Tensor v = g + e_old;  // what compress computes first
    const torch::Tensor r = v.to(torch::kDouble) - (g.to(torch::kDouble) + e_old.to(torch::kDouble));
    if (additions_exact) {
      EXPECT_TRUE(torch::equal(r, torch::zeros_like(r))) << "step " << step;
    }
    EXPECT_TRUE((r.abs() <= v.to(torch::kDouble).abs() * std::ldexp(1.0, -24)).all().item<bool>());
    const float amax = v.abs().max().item<float>();  // one rank: the shared amax is its own
    const torch::Tensor q = c.compress(g, e, amax, formats::RoundingKey{7, uint64_t(step), 0, 0});
    ASSERT_TRUE(torch::equal(q.to(torch::kDouble) + e.to(torch::kDouble), v.to(torch::kDouble)))
        << "step " << step << ": q + e_new != fl(g + e_old)";
    if (format != "fp32") {
      EXPECT_FALSE(torch::equal(q, v)) << "step " << step << ": nothing was quantized";
    }
    sum_q += q.to(torch::kDouble);
    sum_g += g.to(torch::kDouble);
    sum_r += r;
  }
  EXPECT_TRUE(torch::equal(sum_q + e.to(torch::kDouble), sum_g + sum_r));
  if (additions_exact) {
    EXPECT_TRUE(torch::equal(sum_q + e.to(torch::kDouble), sum_g));
  }
}

TEST(DistGradComm, ErrorFeedbackTransmittedPlusResidualIsTheSumExactly) {
  for (const char* f : {"fp32", "bf16", "fp8", "mxfp4", "mxfp8"}) check_bookkeeping(f, true);
}

TEST(DistGradComm, ErrorFeedbackWithFp32ScalesIsExactUpToTheRoundingOfGPlusE) {
  for (const char* f : {"fp4", "nvfp4", "fp8_tensor", "int8"}) check_bookkeeping(f, false);
}

TEST(DistGradComm, Fp32SendsTheGradientAndKeepsNoResidual) {
  const GradCompressor c(recipes::RecipeSet(), "fp32", true);
  EXPECT_TRUE(c.is_fp32());
  std::mt19937 rng(1);
  torch::Tensor e = torch::zeros({5, 7}, torch::kFloat);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor g = torch::randn({5, 7});
    const torch::Tensor q = c.compress(g, e, 0.0f, formats::RoundingKey{});
    EXPECT_TRUE(bitwise_equal(q, g));
    EXPECT_TRUE(bitwise_equal(e, torch::zeros({5, 7})));
  }
}

TEST(DistGradComm, WithoutErrorFeedbackTheResidualStaysZero) {
  const GradCompressor c(recipes::RecipeSet(), "fp4", false);
  torch::Tensor e = torch::zeros({4, 32}, torch::kFloat);
  const torch::Tensor g = torch::randn({4, 32});
  const torch::Tensor q = c.compress(g, e, g.abs().max().item<float>(), formats::RoundingKey{});
  EXPECT_FALSE(torch::equal(q, g));
  EXPECT_TRUE(bitwise_equal(e, torch::zeros({4, 32})));
}

TEST(DistGradComm, SharedAmaxEqualToTheOwnIsPlainFakeQuantize) {
  // The appended sentinel row changes nothing when the shared amax is this
  // rank's own: q equals the recipe's fake_quantize of v, bit for bit.
  for (const char* f : {"fp4", "nvfp4", "fp8_tensor"}) {
    SCOPED_TRACE(f);
    const GradCompressor c(recipes::RecipeSet(), f, false);
    ASSERT_TRUE(c.shares_amax());
    const torch::Tensor g = torch::randn({33, 48});  // 33 rows: a partial 16-row block under nvfp4's 16x16
    torch::Tensor e = torch::zeros_like(g);
    const torch::Tensor q = c.compress(g, e, g.abs().max().item<float>(), formats::RoundingKey{});
    torch::Tensor ref = torch::empty_like(g);
    formats::fake_quantize(g.data_ptr<float>(), ref.data_ptr<float>(), 33, 48, c.spec(), formats::RoundingKey{});
    EXPECT_TRUE(bitwise_equal(q, ref));
  }
}

TEST(DistGradComm, SharedAmaxPutsEveryRankOnOneTensorScale) {
  // Two "ranks" with different data: quantized with the shared amax, each
  // rank's q equals the rows of the recipe's fake_quantize of both ranks'
  // data stacked (one tensor, one tensor amax): the scale is the same.
  const GradCompressor c(recipes::RecipeSet(), "fp4", false);
  const torch::Tensor a = torch::randn({8, 32}), b = 3.0f * torch::randn({8, 32});
  const float amax = std::max(a.abs().max().item<float>(), b.abs().max().item<float>());
  torch::Tensor ea = torch::zeros_like(a), eb = torch::zeros_like(b);
  const torch::Tensor qa = c.compress(a, ea, amax, formats::RoundingKey{});
  const torch::Tensor qb = c.compress(b, eb, amax, formats::RoundingKey{});
  torch::Tensor both = torch::cat({a, b}).contiguous(), ref = torch::empty_like(both);
  formats::fake_quantize(both.data_ptr<float>(), ref.data_ptr<float>(), 16, 32, c.spec(), formats::RoundingKey{});
  EXPECT_TRUE(bitwise_equal(qa, ref.narrow(0, 0, 8)));
  EXPECT_TRUE(bitwise_equal(qb, ref.narrow(0, 8, 8)));
  // With its own (smaller) amax, rank a would have used another tensor scale.
  torch::Tensor e2 = torch::zeros_like(a);
  EXPECT_FALSE(bitwise_equal(c.compress(a, e2, a.abs().max().item<float>(), formats::RoundingKey{}), qa));
}

TEST(DistGradComm, WireBytesPerFormat) {
  // [64, 32] = 2048 elements.
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "fp32").wire_bytes(64, 32), 2048 * 4);
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "bf16").wire_bytes(64, 32), 2048 * 2);
  // fp8: 1 byte each + one 4-byte power-of-two scale per 128x128 block.
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "fp8").wire_bytes(64, 32), 2048 + 4);
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "fp8").wire_bytes(512, 32), 512 * 32 + 4 * 4);
  // fp4: half a byte each + one E4M3 byte per 1x16 block + the FP32 tensor scale.
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "fp4").wire_bytes(64, 32), 1024 + 128 + 4);
  // nvfp4: 16x16 blocks for weights.
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "nvfp4").wire_bytes(64, 32), 1024 + 8 + 4);
  // mxfp4: half a byte each + one E8M0 byte per 1x32 block.
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "mxfp4").wire_bytes(64, 32), 1024 + 64);
  // A tied weight listed twice counts once; 1-D tensors are [1, n].
  const torch::Tensor w = torch::zeros({64, 32}), n = torch::zeros({32});
  EXPECT_EQ(GradCompressor(recipes::RecipeSet(), "fp4").wire_bytes(std::vector<torch::Tensor>{w, n, w}), 1156 + 16 + 2 + 4);
}

// The allgather path (dist.grad_comm_path = allgather) against the exact
// path, for R = 3 "ranks" with different data, each format: every rank's
// compress_packed returns compress()'s q and residual bit for bit, writes
// exactly wire_bytes(rows, cols) bytes (the buffer's next byte, a sentinel,
// is untouched), and those bytes decode (decode_packed, as any other rank
// does) to that q bit for bit; so the sum every rank forms,
// (q_0 + q_1) + q_2 in rank order, is the sum of the exact path's q in
// rank order. Shapes: [33, 48] (a partial 16-row block under nvfp4, three
// 1x16 blocks per row), [1, 33] (a 1-D tensor: an odd E2M1 count, a
// partial 1x16 / 1x32 block), [130, 20] (partial 128x128 blocks under fp8).
TEST(DistGradComm, AllgatherBytesDecodeToTheExactPathsQ) {
  for (const char* f : {"fp32", "bf16", "fp8", "mxfp8", "fp4", "nvfp4", "mxfp4", "fp8_tensor", "int8"}) {
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{33, 48}, {1, 33}, {130, 20}}) {
      SCOPED_TRACE(std::string(f) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
      const GradCompressor c(recipes::RecipeSet(), f, /*error_feedback=*/true);
      std::vector<torch::Tensor> g, e;
      float amax = 0;
      for (int r = 0; r < 3; ++r) {
        g.push_back(float(r + 1) * torch::randn({rows, cols}));
        e.push_back(1e-3f * torch::randn({rows, cols}));  // a residual from an earlier step
        amax = std::max(amax, (g[size_t(r)] + e[size_t(r)]).abs().max().item<float>());
      }
      const int64_t bytes = c.wire_bytes(rows, cols);
      torch::Tensor sum_exact, sum_wire;
      for (int r = 0; r < 3; ++r) {
        const formats::RoundingKey key{5, 2, uint64_t(r), 0};
        torch::Tensor e_exact = e[size_t(r)].clone(), e_wire = e[size_t(r)].clone();
        const torch::Tensor q = c.compress(g[size_t(r)], e_exact, amax, key);
        std::vector<uint8_t> buf(size_t(bytes) + 1, 0xA5);
        const torch::Tensor q2 = c.compress_packed(g[size_t(r)], e_wire, amax, key, buf.data());
        EXPECT_TRUE(bitwise_equal(q2, q)) << "rank " << r;
        EXPECT_TRUE(bitwise_equal(e_wire, e_exact)) << "rank " << r;
        EXPECT_EQ(buf.back(), 0xA5) << "rank " << r << ": wrote past wire_bytes";
        torch::Tensor d = torch::empty({rows, cols}, torch::kFloat);
        c.decode_packed(buf.data(), rows, cols, d.data_ptr<float>());
        EXPECT_TRUE(bitwise_equal(d, q)) << "rank " << r;
        sum_exact = r == 0 ? q.clone() : sum_exact + q;
        sum_wire = r == 0 ? d.clone() : sum_wire + d;
      }
      EXPECT_TRUE(bitwise_equal(sum_wire, sum_exact));
    }
  }
}

TEST(DistGradComm, AllgatherBytesAreTheFormatsCodesAndScales) {
  // fp4 (E2M1 in 1x16 blocks, E4M3 block scales, FP32 tensor scale), one
  // row of 16 values on E2M1's grid with amax 6 = E2M1's max: the tensor
  // scale is S_enc = 448·6/6 = 448 (decode 1/448), the block scale
  // 6·448/6 = 448 = E4M3 code 0x7E, so every element's code is its own
  // E2M1 code: 0 = 0x0, 0.5 = 0x1, 1 = 0x2, 1.5 = 0x3, 2 = 0x4, 3 = 0x5,
  // 4 = 0x6, 6 = 0x7, sign in bit 3; two per byte, element 2i in the low nibble.
  const GradCompressor c(recipes::RecipeSet(), "fp4", false);
  const std::vector<float> v = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -6, 0, 0, 0, 0, 0};
  const torch::Tensor g = torch::tensor(v).reshape({1, 16});
  torch::Tensor e = torch::zeros_like(g);
  std::vector<uint8_t> buf(size_t(c.wire_bytes(1, 16)));
  ASSERT_EQ(buf.size(), 8u + 1u + 4u);
  c.compress_packed(g, e, 6.0f, formats::RoundingKey{}, buf.data());
  const std::vector<uint8_t> codes = {0x10, 0x32, 0x54, 0x76, 0xA9, 0x0F, 0x00, 0x00};
  EXPECT_EQ(std::vector<uint8_t>(buf.begin(), buf.begin() + 8), codes);
  EXPECT_EQ(buf[8], 0x7E);
  const float dec = 1.0f / 448.0f;
  uint32_t bits;
  std::memcpy(&bits, &dec, 4);
  EXPECT_EQ(buf[9] | buf[10] << 8 | buf[11] << 16 | uint32_t(buf[12]) << 24, bits);
}

TEST(DistGradComm, UnknownFormatIsAUserError) {
  try {
    GradCompressor c(recipes::RecipeSet(), "fp5");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("dist.grad_comm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace snip::dist
