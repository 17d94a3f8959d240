// codec_dump: snip's element codec (src/formats/codec.cpp) and E8M0 scale
// codec on the command line, for comparison with ml_dtypes
// (tests/clients/test_ml_dtypes.py). Binary in, binary out, little-endian:
//
//   codec_dump decode FORMAT            -> float32 [2^bits]: decode() of every code
//   codec_dump encode FORMAT SATURATE   stdin float32 [N] -> uint16 [N]: encode(x, RNE, saturate)
//   codec_dump e8m0                     -> float32 [256]: e8m0_decode() of every code
//   codec_dump e8m0-exp                 stdin int32 [N] -> uint8 [N]: e8m0_from_exponent(k)
//
// FORMAT: any name of `snip formats` (e4m3, e5m2, e2m1, e2m3, e3m2, ...);
// SATURATE: 1 or 0. Exit status 2 with one line on stderr for bad usage.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "snip/formats/element_format.h"
#include "snip/formats/scale_format.h"

namespace {

template <typename T>
std::vector<T> read_stdin() {
  std::vector<T> v;
  T x;
  while (std::fread(&x, sizeof x, 1, stdin) == 1) v.push_back(x);
  return v;
}

template <typename T>
void write_stdout(const std::vector<T>& v) {
  std::fwrite(v.data(), sizeof(T), v.size(), stdout);
}

int usage() {
  std::cerr << "usage: codec_dump decode FORMAT | encode FORMAT SATURATE | e8m0 | e8m0-exp\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace snip::formats;
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  try {
    if (cmd == "decode" && argc == 3) {
      const ElementFormat f = find_element_format(argv[2]);
      std::vector<float> out(size_t(1) << f.bits);
      for (uint32_t c = 0; c < out.size(); ++c) out[c] = decode(f, c);
      write_stdout(out);
    } else if (cmd == "encode" && argc == 4) {
      const ElementFormat f = find_element_format(argv[2]);
      const bool sat = std::string(argv[3]) == "1";
      std::vector<uint16_t> out;
      for (float x : read_stdin<float>()) out.push_back(uint16_t(encode(f, x, Rounding::kRNE, 0, sat)));
      write_stdout(out);
    } else if (cmd == "e8m0" && argc == 2) {
      std::vector<float> out(256);
      for (int c = 0; c < 256; ++c) out[size_t(c)] = e8m0_decode(uint8_t(c));
      write_stdout(out);
    } else if (cmd == "e8m0-exp" && argc == 2) {
      std::vector<uint8_t> out;
      for (int32_t k : read_stdin<int32_t>()) out.push_back(e8m0_from_exponent(k));
      write_stdout(out);
    } else {
      return usage();
    }
  } catch (const std::exception& e) {
    std::cerr << "codec_dump: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
