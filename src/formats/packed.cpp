// Packed storage: element codes packed into bytes plus the scale array.
#include <cmath>
#include <stdexcept>

#include "fq_common.h"
#include "snip/formats/fake_quant.h"

namespace snip::formats {

namespace {
void check_bits(int bits) {
  if (bits < 1 || bits > 16)
    throw std::invalid_argument("pack_codes: bits must be in [1, 16], got " + std::to_string(bits));
}
}  // namespace

int64_t packed_bytes(int64_t n, int bits) {
  check_bits(bits);
  if (bits <= 4) return (n + 1) / 2;
  if (bits <= 8) return n;
  return 2 * n;
}

std::vector<uint8_t> pack_codes(const std::vector<uint16_t>& codes, int bits) {
  const int64_t n = int64_t(codes.size());
  std::vector<uint8_t> out(size_t(packed_bytes(n, bits)), 0);
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t c = codes[size_t(i)] & mask;
    if (bits <= 4) {
      out[size_t(i / 2)] |= uint8_t(c << ((i & 1) * 4));  // even element -> low nibble
    } else if (bits <= 8) {
      out[size_t(i)] = uint8_t(c);
    } else {
      out[size_t(2 * i)] = uint8_t(c & 0xFF);  // little-endian
      out[size_t(2 * i + 1)] = uint8_t(c >> 8);
    }
  }
  return out;
}

std::vector<uint16_t> unpack_codes(const std::vector<uint8_t>& bytes, int64_t n, int bits) {
  if (n < 0 || int64_t(bytes.size()) < packed_bytes(n, bits))
    throw std::invalid_argument("unpack_codes: " + std::to_string(bytes.size()) +
                                " bytes hold fewer than " + std::to_string(n) + " codes of " +
                                std::to_string(bits) + " bits");
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (bits <= 4) {
      out[size_t(i)] = uint16_t((bytes[size_t(i / 2)] >> ((i & 1) * 4)) & 0xF);
    } else if (bits <= 8) {
      out[size_t(i)] = bytes[size_t(i)];
    } else {
      out[size_t(i)] = uint16_t(bytes[size_t(2 * i)] | (uint32_t(bytes[size_t(2 * i + 1)]) << 8));
    }
  }
  return out;
}

QuantizedTensor quantize_packed(const float* in, int64_t rows, int64_t cols, const QuantSpec& spec,
                                const RoundingKey& key, const BlockScale* delayed) {
  detail::check_fq_args(in, in, rows, cols, spec, key, /*delayed_ok=*/delayed != nullptr);
  std::vector<float> transformed(spec.hadamard_size ? size_t(rows * cols) : 0);
  in = detail::hadamard_input(in, transformed.data(), rows, cols, spec);
  QuantizedTensor q;
  q.spec = spec;
  q.rows = rows;
  q.cols = cols;
  q.scales = compute_scales_reference(in, rows, cols, spec, delayed);
  std::vector<uint16_t> codes(size_t(rows * cols));
  const bool sr = spec.rounding == Rounding::kStochastic;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const BlockScale& s = q.scales.at(r, c);
      const uint32_t rbits = sr ? random_bits(key, uint64_t(i)) : 0u;
      codes[size_t(i)] =
          uint16_t(encode(spec.element, in[i] * s.encode, spec.rounding, rbits, spec.saturate));
    }
  q.data = pack_codes(codes, spec.element.bits);
  return q;
}

void dequantize(const QuantizedTensor& q, float* out) {
  const std::vector<uint16_t> codes = unpack_codes(q.data, q.rows * q.cols, q.spec.element.bits);
  const float nan = fast::float_of(fast::kCanonicalNaN);
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const int64_t i = r * q.cols + c;
      const BlockScale& s = q.scales.at(r, c);
      const float e = decode(q.spec.element, codes[size_t(i)]);
      out[i] = (std::isnan(e) || std::isnan(s.decode)) ? nan : e * s.decode;
    }
}

}  // namespace snip::formats
