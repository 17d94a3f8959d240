// safetensors file image -> io::parse_safetensors (header JSON, offsets,
// dtypes), then io::decode_to_f32 on every float tensor (tensor_values.cpp)
// and the writer: serialize(parse(x)) must parse back to the same tensors.
#include "harness.h"
#include "snip/io/safetensors.h"
#include "snip/io/tensor_values.h"

using namespace snip::io;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  snip::fuzz::guarded(data, size, [](std::string_view in) {
    const SafeTensors st = parse_safetensors(in, "fuzz.safetensors");
    for (const TensorRecord& r : st.tensors) {
      if (f32_conversion(r.dtype) == F32Conversion::kNone) continue;
      try {
        const std::vector<float> v = decode_to_f32(r, "fuzz.safetensors");
        if (v.size() != size_t(r.numel())) snip::fuzz::finding("decode_to_f32: wrong element count");
      } catch (const snip::UserError&) {
        // F64 beyond FP32's range: a documented refusal; go on with the others.
      }
    }
    const std::string image = serialize_safetensors(st);
    const SafeTensors back = parse_safetensors(image, "serialized");
    if (back.metadata != st.metadata || back.tensors.size() != st.tensors.size())
      snip::fuzz::finding("safetensors round trip changed the file");
    for (const TensorRecord& r : st.tensors) {
      const TensorRecord* b = back.find(r.name);
      if (!b || b->dtype != r.dtype || b->shape != r.shape || b->data != r.data)
        snip::fuzz::finding("safetensors round trip changed a tensor");
    }
  });
  return 0;
}
