#pragma once
// A one-line progress display for training loops, and human-readable durations and sizes.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace mp::train {

/// A one-line progress display: "[epoch 2/10] 123/469 |#####               | 26% 1234 img/s ETA 0:41 loss 0.4312".
/// When `is_tty` (the stream is a terminal) it redraws the line in place with '\r' at most every 0.1 s;
/// otherwise it prints a full line at most every `min_interval_s` and at 100%, so logs stay readable.
/// A `total` <= 0 means unknown: no bar, percentage or ETA. The rate is units per second since construction.
class ProgressBar {
 public:
  /// `label` is shown in brackets ("epoch 2/10"); `unit` names the rate ("img/s").
  ProgressBar(std::ostream& out, std::string label, int64_t total, std::string unit, bool is_tty,
              double min_interval_s = 10.0);
  /// Ends a line drawn on a terminal that finish() did not end (e.g. when an exception left the loop).
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  /// `done` items so far (steps), `units_done` (images or tokens, for the rate), extra fields shown in order.
  void update(int64_t done, double units_done, const std::vector<std::pair<std::string, std::string>>& fields = {});
  /// Final line (the last update's counts, elapsed time instead of ETA, `fields` or else the last update's)
  /// and a newline. Without a terminal the line is left out when update already printed the 100% line and
  /// `fields` is empty. Further calls do nothing.
  void finish(const std::vector<std::pair<std::string, std::string>>& fields = {});
  /// Replace the clock (a monotonic time in seconds) for tests; the start time is re-read from it.
  void set_clock(std::function<double()> now_seconds);
  /// The text of the line for the current state (what update/finish print, without '\r' or newline).
  std::string line(bool final) const;

 private:
  void draw(bool final);

  std::ostream& out_;
  std::string label_, unit_;
  int64_t total_;
  bool tty_;
  double min_interval_s_;
  std::function<double()> now_;
  double start_ = 0, last_draw_ = 0;
  bool drawn_ = false, printed_full_ = false, finished_ = false;
  size_t last_len_ = 0;
  int64_t done_ = 0;
  double units_ = 0;
  std::vector<std::pair<std::string, std::string>> fields_;
};

/// Whether a FILE* is a terminal (isatty).
bool is_terminal(FILE* f);
/// Human-readable duration: "350 ms", "41.2 s", "1:02" (m:ss), "1:02:03" (h:mm:ss); "-" for NaN or negative.
std::string format_duration(double seconds);
/// Human-readable size in binary units: "512 B", "1.5 KiB", "312 MiB", "1.5 GiB" (one decimal below 10).
std::string format_bytes(int64_t bytes);

}  // namespace mp::train
