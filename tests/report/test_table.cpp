// Table::to_markdown: exact GitHub markdown with padded columns, numbers right-aligned.
#include <gtest/gtest.h>

#include "mp/core/error.hpp"
#include "mp/report/table.hpp"

TEST(Table, MarkdownExact) {
  mp::report::Table t;
  t.header = {"precision", "time (s)", "speed-up", "accuracy (%)", "note"};
  t.rows = {{"fp32", "12.5", "1.00x", "94.10", "reference"},
            {"bf16 O2", "4.25", "2.94x", "94.05", ""},
            {"fp16 O2 (diverged)", "-1e+03", "12.00x", "", "a|b"}};
  EXPECT_EQ(t.to_markdown(),
            "| precision          | time (s) | speed-up | accuracy (%) | note      |\n"
            "| ------------------ | -------: | -------: | -----------: | --------- |\n"
            "| fp32               |     12.5 |    1.00x |        94.10 | reference |\n"
            "| bf16 O2            |     4.25 |    2.94x |        94.05 |           |\n"
            "| fp16 O2 (diverged) |   -1e+03 |   12.00x |              | a\\|b      |\n");
}

TEST(Table, NarrowColumnsShortRowsAndUnicode) {
  mp::report::Table t;
  t.header = {"a", "n", "µs"};
  t.rows = {{"x", "1"}, {"ünï", "10", "5%"}};
  EXPECT_EQ(t.to_markdown(),
            "| a   |    n |   µs |\n"
            "| --- | ---: | ---: |\n"
            "| x   |    1 |      |\n"
            "| ünï |   10 |   5% |\n");
}

TEST(Table, MixedColumnIsLeftAligned) {
  mp::report::Table t;
  t.header = {"v"};
  t.rows = {{"1.5"}, {"n/a"}};
  EXPECT_EQ(t.to_markdown(), "| v   |\n| --- |\n| 1.5 |\n| n/a |\n");
}

TEST(Table, RefusesRowsWiderThanHeader) {
  mp::report::Table t;
  t.header = {"a"};
  t.rows = {{"1", "2"}};
  EXPECT_THROW(t.to_markdown(), mp::Error);
  EXPECT_THROW(mp::report::Table{}.to_markdown(), mp::Error);
}
