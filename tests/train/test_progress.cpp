// ProgressBar output on a terminal (redrawn with '\r', at most every 0.1 s) and in a log (full lines
// at most every min_interval_s and at 100%), with a fake clock; duration and size formats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "mp/train/progress.hpp"

using mp::train::ProgressBar;

TEST(ProgressBar, LogOutputThrottledWithFullLineAt100Percent) {
  std::ostringstream os;
  double now = 0;
  ProgressBar bar(os, "epoch 1/2", 10, "img/s", /*is_tty=*/false, /*min_interval_s=*/10);
  bar.set_clock([&] { return now; });
  now = 1;
  bar.update(1, 128);
  EXPECT_EQ(os.str(), "");  // less than 10 s since the start
  now = 10;
  bar.update(5, 640, {{"loss", "0.5"}});
  const std::string l1 = "[epoch 1/2] 5/10 |##########          | 50% 64.0 img/s ETA 0:10 loss 0.5\n";
  EXPECT_EQ(os.str(), l1);
  now = 15;
  bar.update(7, 896);
  EXPECT_EQ(os.str(), l1);  // 5 s since the last line
  now = 20;
  bar.update(10, 1280, {{"loss", "0.25"}, {"scale", "65536"}});
  const std::string l2 = "[epoch 1/2] 10/10 |####################| 100% 64.0 img/s time 0:20 loss 0.25 scale 65536\n";
  EXPECT_EQ(os.str(), l1 + l2);
  bar.finish();  // the 100% line is already there
  EXPECT_EQ(os.str(), l1 + l2);
  bar.finish({{"acc", "0.9"}});  // a finished bar prints nothing more
  EXPECT_EQ(os.str(), l1 + l2);
}

TEST(ProgressBar, LogFinishPrintsFinalLineWithNewFields) {
  std::ostringstream os;
  double now = 0;
  ProgressBar bar(os, "epoch 3/3", 100, "tok/s", false, 10);
  bar.set_clock([&] { return now; });
  now = 3;
  bar.update(100, 3000);
  now = 4;
  bar.finish({{"val_ppl", "123.4"}});
  EXPECT_EQ(os.str(),
            "[epoch 3/3] 100/100 |####################| 100% 1000 tok/s time 0:03\n"
            "[epoch 3/3] 100/100 |####################| 100% 750 tok/s time 0:04 val_ppl 123.4\n");
}

TEST(ProgressBar, TerminalRedrawsInPlaceAtMostEveryTenthOfASecond) {
  std::ostringstream os;
  double now = 0;
  ProgressBar bar(os, "train", 4, "tok/s", /*is_tty=*/true);
  bar.set_clock([&] { return now; });
  now = 0.5;
  bar.update(1, 100, {{"loss", "1.234567"}});
  const std::string a = "[train] 1/4 |#####               | 25% 200 tok/s ETA 0:02 loss 1.234567";
  EXPECT_EQ(os.str(), "\r" + a);
  now = 0.55;
  bar.update(2, 200);
  EXPECT_EQ(os.str(), "\r" + a);  // 0.05 s after the last redraw
  now = 0.7;
  bar.update(2, 280);
  const std::string b = "[train] 2/4 |##########          | 50% 400 tok/s ETA 0:01";
  ASSERT_LT(b.size(), a.size());
  const std::string b_drawn = "\r" + b + std::string(a.size() - b.size(), ' ');  // blanks erase the old tail
  EXPECT_EQ(os.str(), "\r" + a + b_drawn);
  now = 1.0;
  bar.finish({{"loss", "0.9"}});
  const std::string c = "[train] 2/4 |##########          | 50% 280 tok/s time 0:01 loss 0.9";
  EXPECT_EQ(os.str(), "\r" + a + b_drawn + "\r" + c + "\n");
}

TEST(ProgressBar, TerminalAlwaysDrawsCompletion) {
  std::ostringstream os;
  double now = 0;
  ProgressBar bar(os, "", 2, "", true);
  bar.set_clock([&] { return now; });
  now = 0.01;
  bar.update(1, 0);
  now = 0.02;
  bar.update(2, 0);  // 100% is drawn even within 0.1 s
  EXPECT_EQ(os.str(), "\r1/2 |##########          | 50% ETA 0:00\r2/2 |####################| 100% time 0:00");
}

TEST(ProgressBar, UnknownTotalShowsCountAndRate) {
  std::ostringstream os;
  double now = 0;
  ProgressBar bar(os, "eval", 0, "img/s", false, 0);
  bar.set_clock([&] { return now; });
  now = 2;
  bar.update(3, 7);
  EXPECT_EQ(os.str(), "[eval] 3 3.50 img/s\n");
}

TEST(ProgressBar, DestructorEndsAnUnfinishedTerminalLine) {
  std::ostringstream os;
  {
    ProgressBar bar(os, "x", 5, "", true);
    bar.update(1, 0);
  }
  ASSERT_FALSE(os.str().empty());
  EXPECT_EQ(os.str().back(), '\n');
}

TEST(Format, Durations) {
  EXPECT_EQ(mp::train::format_duration(0.35), "350 ms");
  EXPECT_EQ(mp::train::format_duration(41.23), "41.2 s");
  EXPECT_EQ(mp::train::format_duration(59.97), "1:00");  // would print as "60.0 s"
  EXPECT_EQ(mp::train::format_duration(62), "1:02");
  EXPECT_EQ(mp::train::format_duration(3723), "1:02:03");
  EXPECT_EQ(mp::train::format_duration(100 * 3600.0), "100:00:00");
  EXPECT_EQ(mp::train::format_duration(std::nan("")), "-");
  EXPECT_EQ(mp::train::format_duration(-1), "-");
}

TEST(Format, Bytes) {
  EXPECT_EQ(mp::train::format_bytes(0), "0 B");
  EXPECT_EQ(mp::train::format_bytes(1023), "1023 B");
  EXPECT_EQ(mp::train::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(mp::train::format_bytes(312LL << 20), "312 MiB");
  EXPECT_EQ(mp::train::format_bytes(3LL << 29), "1.5 GiB");
  EXPECT_EQ(mp::train::format_bytes((1LL << 20) - 1), "1.0 MiB");  // not "1024 KiB"
  EXPECT_EQ(mp::train::format_bytes(-2048), "-2.0 KiB");
}

TEST(Format, IsTerminal) {
  EXPECT_FALSE(mp::train::is_terminal(nullptr));
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EXPECT_FALSE(mp::train::is_terminal(f));
  std::fclose(f);
}
