// The kernel profiler: labels (element-wise op names, "cast" for dtype-changing copies, kernel
// families), call counts, operand bytes, exclusive times, and nothing recorded while off.
#include <gtest/gtest.h>

#include <chrono>

#include "mp/core/profiler.hpp"
#include "mp/mp.hpp"

using namespace mp;

namespace {

const profiler::OpStats* find(const std::vector<profiler::OpStats>& s, const std::string& name) {
  for (const auto& o : s)
    if (o.name == name) return &o;
  return nullptr;
}

}  // namespace

TEST(Profiler, RecordsLabelsCallsAndBytes) {
  Tensor a = rand({64, 32}), b = rand({64, 32}), w = rand({32, 16});
  std::vector<profiler::OpStats> s;
  const auto t0 = std::chrono::steady_clock::now();
  {
    profiler::Session session;
    Tensor c = add(a, b);
    c = add(c, a);
    Tensor h = c.to(DType::bf16);
    Tensor m = matmul(a, w);
    Tensor r = sum(m);
    (void)h;
    (void)r;
    s = profiler::snapshot();
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto* add_ = find(s, "add");
  ASSERT_NE(add_, nullptr);
  EXPECT_EQ(add_->calls, 2);
  EXPECT_DOUBLE_EQ(add_->bytes, 2.0 * 3 * 64 * 32 * 4);  // two inputs and one output, f32, per call
  const auto* cast = find(s, "cast");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->calls, 1);
  EXPECT_DOUBLE_EQ(cast->bytes, 64.0 * 32 * (4 + 2));
  ASSERT_NE(find(s, "matmul"), nullptr);
  ASSERT_NE(find(s, "sum"), nullptr);
  double total = 0;
  for (const auto& o : s) {
    EXPECT_GE(o.seconds, 0.0) << o.name;
    total += o.seconds;
  }
  EXPECT_LE(total, wall);  // exclusive times never add up to more than the elapsed time
  for (size_t i = 1; i < s.size(); ++i) EXPECT_GE(s[i - 1].seconds, s[i].seconds);  // largest first
}

TEST(Profiler, OffRecordsNothingAndSessionRestores) {
  profiler::reset();
  EXPECT_FALSE(profiler::enabled());
  Tensor a = rand({8});
  (void)add(a, a);
  EXPECT_TRUE(profiler::snapshot().empty());
  {
    profiler::Session s;
    EXPECT_TRUE(profiler::enabled());
    (void)mul(a, a);
  }
  EXPECT_FALSE(profiler::enabled());
  ASSERT_EQ(profiler::snapshot().size(), 1u);  // the table survives the session for reading
  EXPECT_EQ(profiler::snapshot()[0].name, "mul");
  profiler::reset();
  EXPECT_TRUE(profiler::snapshot().empty());
}
