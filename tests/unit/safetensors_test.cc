// The safetensors reader on well-formed and malformed input: every malformed case is a beluga::Error
// naming the problem, never a crash or an out-of-bounds read (the suite also runs under ASan).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "loader/safetensors.h"
#include "util/error.h"

namespace beluga {
namespace {

std::string image(const std::string& header, size_t data_bytes, uint64_t declared_len = UINT64_MAX) {
  uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xff);
  return s + header + std::string(data_bytes, '\x01');
}

void expect_error(const std::string& bytes, const std::string& needle) {
  try {
    SafetensorsFile::from_bytes(bytes);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ParsesTensorsAndMetadata) {
  std::string bytes =
      image(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})",
            22);
  auto f = SafetensorsFile::from_bytes(bytes);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.get("a").dtype, DType::kF32);
  EXPECT_EQ(f.get("a").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f.get("b").nbytes, 6u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("c"), nullptr);
  EXPECT_THROW(f.get("c"), Error);
}

TEST(Safetensors, RejectsTruncatedFile) {
  expect_error(std::string(5, '\0'), "truncated");
}

TEST(Safetensors, RejectsHeaderLongerThanFile) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 1000),
               "exceeds the file size");
}

TEST(Safetensors, RejectsHugeHeaderLength) {
  expect_error(image("{}", 0, 1ull << 40), "header too long");
}

TEST(Safetensors, RejectsCorruptJson) {
  expect_error(image(R"({"a":{"dtype":)", 0), "corrupt safetensors header");
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_error(image(R"({"a":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,4]}})", 4),
               "unsupported dtype Q4_K");
}

TEST(Safetensors, RejectsOverlappingOffsets) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     12),
               "overlapping");
}

TEST(Safetensors, RejectsOffsetsPastTheData) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "outside the data");
}

TEST(Safetensors, RejectsShapeThatDisagreesWithBytes) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "do not match");
}

TEST(Safetensors, RejectsNegativeOrNonIntegerDims) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "bad dimension");
  expect_error(image(R"({"a":{"dtype":"F32","shape":["x"],"data_offsets":[0,4]}})", 4), "bad dimension");
}

TEST(Safetensors, RejectsMissingFields) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1]}})", 4), "needs dtype, shape and data_offsets");
  expect_error(image(R"([1,2,3])", 0), "not a JSON object");
}

TEST(Safetensors, WriterRoundTrips) {
  const std::string path = ::testing::TempDir() + "/roundtrip.safetensors";
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> h = {0x3f80, 0x4000};
  write_safetensors(path, {{"logits", DType::kF32, {2, 3}, v.data()}, {"w", DType::kBF16, {2}, h.data()}});
  SafetensorsFile f(path);
  const TensorInfo& t = f.get("logits");
  ASSERT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(t.data, v.data(), 24), 0);
  EXPECT_EQ(bf16_to_f32(static_cast<const uint16_t*>(f.get("w").data)[1]), 2.0f);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace beluga
