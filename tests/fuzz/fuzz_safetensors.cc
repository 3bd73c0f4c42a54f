// libFuzzer target: the safetensors header parser on a file image (the input bytes). Contract
// (loader/safetensors.h): a corrupt image is a beluga::Error, never a crash; every tensor it accepts
// lies inside the data section, with its byte count matching shape and dtype.
#include "fuzz_support.h"
#include "loader/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(beluga::fuzz::as_text(data, size));
  beluga::fuzz::expect_only<beluga::Error>([&] {
    const auto f = beluga::SafetensorsFile::from_bytes(bytes);
    const char* begin = bytes.data();
    const char* end = begin + bytes.size();
    for (const auto& [name, t] : f.tensors()) {
      const char* p = static_cast<const char*>(t.data);
      if (p < begin + 8 || p > end || t.nbytes > size_t(end - p))
        beluga::fuzz::finding("tensor outside the file");
      uint64_t n = beluga::dtype_size(t.dtype);
      for (int64_t d : t.shape) n *= uint64_t(d);
      if (n != t.nbytes) beluga::fuzz::finding("tensor size does not match shape");
      volatile char sink = t.nbytes ? p[t.nbytes - 1] : 0;  // ASan checks the last byte is readable
      (void)sink;
    }
  });
  return 0;
}
