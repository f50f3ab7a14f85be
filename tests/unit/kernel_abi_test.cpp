// abi/kernel_abi.h: the args-buffer encoder and the error words, checked against the layout the
// header documents (scalars in order, 4 bytes or 8 bytes 8-aligned; then each ndarray's shape
// words; then one error word per task; then the adstack words).
#include "abi/kernel_abi.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace vkad::abi {
namespace {

CompiledKernel three_params() {
  CompiledKernel k;
  k.name = "k";
  k.params = {{"a", ParamKind::kScalar, DType::kF32, 0, false},
              {"x", ParamKind::kNdArray, DType::kF32, 2, true},
              {"b", ParamKind::kScalar, DType::kF64, 0, false},
              {"n", ParamKind::kScalar, DType::kI32, 0, false}};
  k.tasks.resize(2);
  return k;
}

TEST(KernelAbi, EncodeArgsFollowsTheDocumentedLayout) {
  CompiledKernel k = three_params();
  // a at 0; b (8 bytes) 8-aligned after a: 8; n at 16; x's shape (2 words) after: 20; error words
  // (2 tasks) at 28 and 32.
  ASSERT_EQ(k.scalar_offset(0), 0u);
  ASSERT_EQ(k.scalar_offset(2), 8u);
  ASSERT_EQ(k.scalar_offset(3), 16u);
  ASSERT_EQ(k.shape_offset(1), 20u);
  ASSERT_EQ(k.error_flag_offset(0), 28u);
  ASSERT_EQ(k.error_flag_offset(1), 32u);
  std::vector<ScalarValue> scalars = {{1.5, 0}, {}, {-2.25, 0}, {0, -7}};
  std::vector<uint32_t> shape = {3, 5};
  std::vector<const std::vector<uint32_t>*> shapes = {nullptr, &shape, nullptr, nullptr};
  std::vector<std::byte> buf(k.args_bytes(), std::byte{0xAB});
  encode_args(k, scalars, shapes, {}, buf.data());
  float a;
  double b;
  int32_t n;
  uint32_t s0, s1, e0, e1;
  std::memcpy(&a, buf.data() + 0, 4);
  std::memcpy(&b, buf.data() + 8, 8);
  std::memcpy(&n, buf.data() + 16, 4);
  std::memcpy(&s0, buf.data() + 20, 4);
  std::memcpy(&s1, buf.data() + 24, 4);
  std::memcpy(&e0, buf.data() + 28, 4);
  std::memcpy(&e1, buf.data() + 32, 4);
  EXPECT_EQ(a, 1.5f);
  EXPECT_EQ(b, -2.25);
  EXPECT_EQ(n, -7);
  EXPECT_EQ(s0, 3u);
  EXPECT_EQ(s1, 5u);
  EXPECT_EQ(e0, 0u);  // error words start cleared, whatever the buffer held
  EXPECT_EQ(e1, 0u);
}

// encode_args writes in one pass with running offsets; the offset functions scan from the first
// parameter. Both must give one layout, with ndarrays between the scalars, 8-byte scalars after
// 4-byte ones and tasks with and without adstack words.
TEST(KernelAbi, EncodeArgsWritesWhereTheOffsetFunctionsSay) {
  CompiledKernel k;
  k.name = "mixed";
  k.params = {{"x", ParamKind::kNdArray, DType::kF32, 3, true},
              {"n", ParamKind::kScalar, DType::kI32, 0, false},
              {"d", ParamKind::kScalar, DType::kF64, 0, false},
              {"y", ParamKind::kNdArray, DType::kI32, 1, false},
              {"m", ParamKind::kScalar, DType::kU32, 0, false},
              {"l", ParamKind::kScalar, DType::kI64, 0, false}};
  k.tasks.resize(3);
  k.tasks[1].adstacks.resize(2);
  k.tasks[2].adstacks.resize(1);
  std::vector<ScalarValue> scalars = {{}, {0, -3}, {0.5, 0}, {}, {0, 9}, {0, -(int64_t{1} << 40)}};
  std::vector<uint32_t> xs = {2, 3, 4}, ys = {7};
  std::vector<const std::vector<uint32_t>*> shapes = {&xs, nullptr, nullptr, &ys, nullptr, nullptr};
  std::vector<std::vector<uint32_t>> words(3);
  for (uint32_t t = 1; t < 3; ++t) {
    words[t].resize(adstack::args_words(k.tasks[t].adstacks.size()));
    for (uint32_t w = 0; w < words[t].size(); ++w) words[t][w] = 100 * t + w + 1;
  }
  std::vector<std::byte> got(k.args_bytes(), std::byte{0xAB});
  encode_args(k, scalars, shapes, words, got.data());
  // The expected buffer, built field by field from the offset functions.
  std::vector<std::byte> want(k.args_bytes(), std::byte{0});
  auto put = [&](uint32_t at, const void* v, size_t n) { std::memcpy(want.data() + at, v, n); };
  const int32_t n = -3;
  const double d = 0.5;
  const uint32_t m = 9;
  const int64_t l = -(int64_t{1} << 40);
  put(k.scalar_offset(1), &n, 4);
  put(k.scalar_offset(2), &d, 8);
  put(k.scalar_offset(4), &m, 4);
  put(k.scalar_offset(5), &l, 8);
  put(k.shape_offset(0), xs.data(), 12);
  put(k.shape_offset(3), ys.data(), 4);
  put(k.adstack_args_offset(1), words[1].data(), 4 * words[1].size());
  put(k.adstack_args_offset(2), words[2].data(), 4 * words[2].size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
}

TEST(KernelAbi, ErrorWordsRoundTrip) {
  EXPECT_EQ(decode_error_word(kErrorOutOfBounds).code, kErrorOutOfBounds);
  EXPECT_EQ(decode_error_word(kErrorOutOfBounds).stack, -1);
  for (uint32_t st : {0u, 1u, 41u, 4095u}) {
    ErrorWord e = decode_error_word(adstack_overflow_word(st));
    EXPECT_EQ(e.code, kErrorAdstackOverflow);
    EXPECT_EQ(e.stack, static_cast<int64_t>(st));
  }
  EXPECT_EQ(decode_error_word(kErrorAdstackOverflow).stack, -1);  // no stack named
  for (uint32_t site : {0u, 7u, 65535u}) {
    ErrorWord e = decode_error_word(non_finite_word(site));
    EXPECT_EQ(e.code, kErrorNonFinite);
    EXPECT_EQ(e.site, static_cast<int64_t>(site));
    EXPECT_EQ(e.stack, -1);
  }
  EXPECT_EQ(decode_error_word(kErrorNonFinite).site, -1);
  EXPECT_EQ(decode_error_word(out_of_bounds_word(12)).code, kErrorOutOfBounds);
  EXPECT_EQ(decode_error_word(out_of_bounds_word(12)).site, 12);
  EXPECT_EQ(decode_error_word(kErrorOutOfBounds).site, -1);
}

}  // namespace
}  // namespace vkad::abi
