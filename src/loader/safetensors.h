// safetensors files: a validated, memory-mapped reader and a small writer.
// The reader checks the whole header up front (size, JSON, dtypes, shapes against byte ranges, ranges
// inside the file and not overlapping), so a truncated or corrupt file is an Error, never a crash.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "util/file.h"

namespace beluga {

struct TensorInfo {
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
  Tensor view() const;  // a CPU view of the mapped bytes (read-only in practice)
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // Parses an in-memory image (the bytes must outlive the object); used by tests on malformed input.
  static SafetensorsFile from_bytes(const std::string& bytes, const std::string& name = "<memory>");

  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws naming the file when absent
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void parse(const unsigned char* data, size_t size);

  MappedFile file_;
  std::string path_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace beluga
