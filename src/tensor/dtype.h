// Element types of weights and activations, and scalar conversions between them.
// bf16/f16/f8_e4m3 are stored as raw bits; arithmetic always happens in f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace beluga {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI64, kI32, kU8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
bool dtype_from_name(std::string_view name, DType* out);

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) {
  return bits_to_f32(uint32_t(h) << 16);
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);

// OCP e4m3fn (no infinities; 0x7f/0xff are NaN): bias 7, denormals m/8 * 2^-6.
// The bits are placed in an f32's low exponent/mantissa and rescaled by 2^120, which is exact for
// normals and denormals alike; the vector kernels use the same trick.
inline float f8e4m3_to_f32(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return bits_to_f32(0x7fc00000u);
  float mag = bits_to_f32(uint32_t(b & 0x7f) << 20) * 0x1p120f;
  return (b & 0x80) ? -mag : mag;
}

// Element (n, k) of a block-scaled FP8 matrix of `cols` columns: q[n, k] times its [bn x bk] block's
// scale (scale: [ceil(rows / bn), ceil(cols / bk)], row-major), the value its product computes with.
inline float fp8_block_value(const uint8_t* q, const float* scale, int64_t n, int64_t k, int64_t cols,
                             int64_t bn, int64_t bk) {
  return f8e4m3_to_f32(q[n * cols + k]) * scale[(n / bn) * ((cols + bk - 1) / bk) + k / bk];
}

}  // namespace beluga
