#include "tensor/dtype.h"

#include <cmath>

namespace beluga {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  static constexpr struct {
    std::string_view name;
    DType type;
  } kNames[] = {{"F32", DType::kF32},        {"BF16", DType::kBF16}, {"F16", DType::kF16},
                {"F8_E4M3", DType::kF8E4M3}, {"I64", DType::kI64},   {"I32", DType::kI32},
                {"U8", DType::kU8}};
  for (const auto& n : kNames) {
    if (n.name == name) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(float(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = bits_to_f32(((exp + 112) << 23) | (man << 13));
  }
  return sign ? -v : v;
}

}  // namespace beluga
