#include "kernels/common/status_macros.h"

#include "gtest/gtest.h"

namespace statecache {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("x is odd");
  return x / 2;
}

absl::Status QuarterInto(int x, int* out) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(*out, Half(half));
  RETURN_IF_ERROR(*out > 100 ? absl::OutOfRangeError("too big") : absl::OkStatus());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagatesFirstErrorAndAssignsValues) {
  int out = -1;
  EXPECT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(QuarterInto(6, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuarterInto(800, &out).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace statecache
