// TorchBoundary: every kind of exception libtorch glue can throw becomes the
// documented status code with the exception's message.
#include "shared/model/torch_boundary.h"

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace lede::model {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A failing TORCH_CHECK inside a real op is kInternal with torch's message,
// prefixed by the operation's name and without the C++ backtrace.
TEST(TorchBoundaryTest, TorchErrorIsInternalWithMessage) {
  Status s = TorchBoundary("matmul", []() -> Status {
    at::matmul(at::zeros({2, 3}), at::zeros({4, 5}));
    return OkStatus();
  });
  EXPECT_THAT(s, StatusIs(StatusCode::kInternal));
  EXPECT_THAT(std::string(s.message()), StartsWith("matmul: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot be multiplied"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("Exception raised from")));
}

// A standard exception is kInternal with its what().
TEST(TorchBoundaryTest, StdExceptionIsInternalWithMessage) {
  StatusOr<int64_t> r = TorchBoundary("load", []() -> StatusOr<int64_t> {
    throw std::runtime_error("disk on fire");
  });
  EXPECT_THAT(r, StatusIs(StatusCode::kInternal));
  EXPECT_EQ(std::string(r.status().message()), "load: disk on fire");
}

// std::bad_alloc is kResourceExhausted, never kInternal.
TEST(TorchBoundaryTest, BadAllocIsResourceExhausted) {
  Status s = TorchBoundary("alloc", []() -> Status { throw std::bad_alloc(); });
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(std::string(s.message()), "alloc: out of memory");
}

// torch's own out-of-memory error is kResourceExhausted too.
TEST(TorchBoundaryTest, TorchOutOfMemoryIsResourceExhausted) {
  Status s = TorchBoundary("kv", []() -> Status {
    throw c10::OutOfMemoryError({"f", "file.cc", 1}, "CUDA out of memory");
  });
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA out of memory"));
}

// Something that is no std::exception still becomes kInternal.
TEST(TorchBoundaryTest, UnknownExceptionIsInternal) {
  Status s = TorchBoundary("x", []() -> Status { throw 42; });
  EXPECT_THAT(s, StatusIs(StatusCode::kInternal));
  EXPECT_EQ(std::string(s.message()), "x: unknown exception");
}

// Without an exception the callable's own result passes through unchanged,
// errors included; an empty name adds no prefix.
TEST(TorchBoundaryTest, ResultsPassThrough) {
  StatusOr<int64_t> ok = TorchBoundary("sum", [] {
    return StatusOr<int64_t>(at::ones({3}).sum().item<int64_t>());
  });
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(*ok, 3);
  Status bad = TorchBoundary("", [] { return InvalidArgumentError("bad shape"); });
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  Status thrown = TorchBoundary("", []() -> Status { throw std::logic_error("oops"); });
  EXPECT_EQ(std::string(thrown.message()), "oops");
}

}  // namespace
}  // namespace lede::model
