// plot_lines / plot_bars: PNG files (checked by their magic bytes) plus re-runnable .dat/.gp files when
// gnuplot is installed (skipped otherwise); argument errors; the "gnuplot not found" message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "mp/core/error.hpp"
#include "mp/report/plot.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::report::Series;
using mp::test::read_file;
using mp::test::scratch_dir;

namespace {

bool is_png(const fs::path& p) { return read_file(p).rfind("\x89PNG\r\n\x1a\n", 0) == 0; }

}  // namespace

TEST(Plot, LinesWritePngDataAndScript) {
  if (!mp::report::gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  const fs::path dir = scratch_dir("plot", "lines");
  const fs::path png = dir / "sub dir" / "loss's.png";  // a new folder, a space and a quote in the names
  Series a{"fp32", {}, {}}, b{"bf16 O2 'quoted' under_score", {}, {}};
  for (int i = 0; i < 200; ++i) {
    a.x.push_back(i), a.y.push_back(std::exp(-i / 50.0));
    b.x.push_back(i), b.y.push_back(i == 100 ? NAN : 1.1 * std::exp(-i / 50.0));
  }
  mp::report::plot_lines(png.string(), "training loss", "step", "loss", {a, b, Series{"empty", {}, {}}},
                         /*log_y=*/true);
  ASSERT_TRUE(fs::exists(png));
  EXPECT_TRUE(is_png(png));
  const std::string dat = read_file(dir / "sub dir" / "loss's.dat");
  const std::string gp = read_file(dir / "sub dir" / "loss's.gp");
  EXPECT_NE(dat.find("100 ?"), std::string::npos);  // the NaN point is marked missing
  EXPECT_NE(gp.find("set logscale y"), std::string::npos);
  EXPECT_NE(gp.find("'training loss'"), std::string::npos);
  EXPECT_NE(gp.find("index 1"), std::string::npos);
  EXPECT_EQ(gp.find("index 2"), std::string::npos);  // the empty series is left out
  // The script re-plots on its own from its folder.
  fs::remove(png);
  ASSERT_EQ(std::system(("cd '" + (dir / "sub dir").string() + "' && gnuplot \"loss's.gp\" 2>/dev/null").c_str()), 0);
  EXPECT_TRUE(is_png(png));
}

TEST(Plot, BarsWritePng) {
  if (!mp::report::gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  const fs::path dir = scratch_dir("plot", "bars");
  const fs::path png = dir / "time.png";
  mp::report::plot_bars(png.string(), "training time", "seconds", {"fp32", "bf16 O2", "fp16 \"O3\""},
                        {12.5, 4.25, 3.0});
  EXPECT_TRUE(is_png(png));
  EXPECT_NE(read_file(dir / "time.dat").find("\"bf16 O2\" 4.25"), std::string::npos);
}

TEST(Plot, ArgumentErrors) {
  const fs::path dir = scratch_dir("plot", "errors");
  const std::string png = (dir / "x.png").string();
  EXPECT_THROW(mp::report::plot_lines(png, "t", "x", "y", {Series{"s", {1, 2}, {1}}}), mp::Error);
  EXPECT_THROW(mp::report::plot_lines(png, "t", "x", "y", {}), mp::Error);
  EXPECT_THROW(mp::report::plot_lines(png, "t", "x", "y", {Series{"neg", {1, 2}, {0, -1}}}, /*log_y=*/true), mp::Error);
  EXPECT_THROW(mp::report::plot_bars(png, "t", "y", {"a", "b"}, {1}), mp::Error);
  EXPECT_THROW(mp::report::plot_bars(png, "t", "y", {}, {}), mp::Error);
  EXPECT_FALSE(fs::exists(png));
}

TEST(Plot, MissingGnuplotSaysHowToInstall) {
  // In a child process whose PATH has no gnuplot (a fresh process: the availability check is cached).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const fs::path dir = scratch_dir("plot", "missing");
  const std::string png = (dir / "x.png").string();
  EXPECT_EXIT(
      {
        ::setenv("PATH", "/nonexistent", 1);
        int code = 1;
        try {
          mp::report::plot_lines(png, "t", "x", "y", {Series{"s", {1, 2}, {1, 2}}});
        } catch (const mp::Error& e) {
          const std::string msg = e.what();
          code =
              msg.find("gnuplot not found; install it with: apt-get install gnuplot-nox") != std::string::npos ? 0 : 2;
        }
        // The data and script are still written for later use.
        if (code == 0 && !(fs::exists(dir / "x.dat") && fs::exists(dir / "x.gp"))) code = 3;
        fs::remove_all(dir);  // _Exit runs no destructors
        std::_Exit(code);
      },
      ::testing::ExitedWithCode(0), "");
}

// A heat map: one row per label (first on top), one box per finite cell; non-finite cells stay blank; a single
// column or row draws too; shares fix the colour bar to [0, 1]; mismatched sizes are refused.
TEST(Plot, HeatmapWritesPngWithBlankNonFiniteCells) {
  if (!mp::report::gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  const fs::path dir = scratch_dir("plot", "heatmap");
  const fs::path png = dir / "numerics_grad_zero.png";
  mp::report::plot_heatmap(png.string(), "zeros", "step", "share", {"conv1", "layer1.0.bn'1", "fc"}, {10, 20, 30},
                           {{0.0, 0.5, 1.0}, {NAN, 0.25, 0.75}, {0.1, INFINITY, 0.3}}, /*shares=*/true);
  ASSERT_TRUE(fs::exists(png));
  EXPECT_TRUE(is_png(png));
  const std::string dat = read_file(dir / "numerics_grad_zero.dat");
  const std::string gp = read_file(dir / "numerics_grad_zero.gp");
  int cells = 0;
  for (size_t at = dat.find('\n'); at != std::string::npos && at + 1 < dat.size(); at = dat.find('\n', at + 1)) ++cells;
  EXPECT_EQ(cells, 7);                                             // 9 cells, 2 non-finite left out
  EXPECT_NE(dat.find("20 1 5 0.25\n"), std::string::npos) << dat;  // x, row, half a column (5), value
  EXPECT_NE(gp.find("'layer1.0.bn''1' 1"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set yrange [2.5:-0.5]"), std::string::npos) << gp;  // the first row on top
  EXPECT_NE(gp.find("set cbrange [0:1]"), std::string::npos) << gp;
  // one column
  mp::report::plot_heatmap((dir / "one.png").string(), "one", "step", "log10", {"a"}, {7}, {{-3.0}});
  EXPECT_TRUE(is_png(dir / "one.png"));
  EXPECT_EQ(read_file(dir / "one.gp").find("cbrange"), std::string::npos);
  EXPECT_THROW(mp::report::plot_heatmap((dir / "bad.png").string(), "t", "x", "c", {"a", "b"}, {1, 2}, {{1, 2}}),
               mp::Error);
  EXPECT_THROW(mp::report::plot_heatmap((dir / "bad.png").string(), "t", "x", "c", {"a"}, {1, 2}, {{1}}), mp::Error);
  EXPECT_THROW(mp::report::plot_heatmap((dir / "bad.png").string(), "t", "x", "c", {"a"}, {1}, {{NAN}}), mp::Error);
}
