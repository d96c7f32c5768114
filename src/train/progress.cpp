// ProgressBar and the human-readable duration/size formats.
#include "mp/train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ostream>

namespace mp::train {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// "0:41", "12:05", "1:02:03" (whole seconds, rounded).
std::string clock_str(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "-:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

std::string rate_str(double rate) {
  char buf[48];
  std::snprintf(buf, sizeof buf, rate >= 100 ? "%.0f" : rate >= 10 ? "%.1f" : "%.2f", rate);
  return buf;
}

constexpr int kBarWidth = 20;
constexpr double kTtyInterval = 0.1;  // seconds between terminal redraws

}  // namespace

ProgressBar::ProgressBar(std::ostream& out, std::string label, int64_t total, std::string unit, bool is_tty,
                         double min_interval_s)
    : out_(out),
      label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      tty_(is_tty),
      min_interval_s_(min_interval_s),
      now_(steady_seconds) {
  start_ = last_draw_ = now_();
}

ProgressBar::~ProgressBar() {
  if (tty_ && drawn_ && !finished_) {
    try {
      out_ << '\n' << std::flush;
    } catch (...) {  // a destructor must not throw
    }
  }
}

void ProgressBar::set_clock(std::function<double()> now_seconds) {
  now_ = std::move(now_seconds);
  start_ = last_draw_ = now_();
}

std::string ProgressBar::line(bool final) const {
  const double elapsed = now_() - start_;
  const bool complete = final || (total_ > 0 && done_ >= total_);
  // Built with append(): GCC 12 warns falsely (-Wrestrict) on chains of `"literal" + std::string`.
  std::string s;
  if (!label_.empty()) s.append("[").append(label_).append("] ");
  s.append(std::to_string(done_));
  if (total_ > 0) {
    const int64_t clamped = std::clamp<int64_t>(done_, 0, total_);
    const auto filled = static_cast<size_t>(clamped * kBarWidth / total_);
    s.append("/").append(std::to_string(total_)).append(" |");
    s.append(filled, '#').append(static_cast<size_t>(kBarWidth) - filled, ' ');
    s.append("| ").append(std::to_string(clamped * 100 / total_)).append("%");
  }
  if (!unit_.empty()) {
    s.append(" ").append(elapsed > 0 ? rate_str(units_ / elapsed) : std::string("-")).append(" ").append(unit_);
  }
  if (complete) {
    s.append(" time ").append(clock_str(elapsed));
  } else if (total_ > 0) {
    const bool known = done_ > 0 && elapsed > 0;
    s.append(" ETA ").append(known
                                 ? clock_str(static_cast<double>(total_ - done_) * elapsed / static_cast<double>(done_))
                                 : std::string("-:--"));
  }
  for (const auto& [k, v] : fields_) s.append(" ").append(k).append(" ").append(v);
  return s;
}

void ProgressBar::draw(bool final) {
  const std::string text = line(final);
  if (tty_) {
    out_ << '\r' << text;
    if (text.size() < last_len_) out_ << std::string(last_len_ - text.size(), ' ');  // erase a longer old line
    last_len_ = text.size();
  } else {
    out_ << text << '\n';
  }
  out_.flush();
  drawn_ = true;
  last_draw_ = now_();
}

void ProgressBar::update(int64_t done, double units_done,
                         const std::vector<std::pair<std::string, std::string>>& fields) {
  if (finished_) return;
  done_ = done;
  units_ = units_done;
  fields_ = fields;
  const double now = now_();
  const bool complete = total_ > 0 && done >= total_;
  if (tty_) {
    if (!drawn_ || complete || now - last_draw_ >= kTtyInterval) draw(false);
  } else if (complete) {
    if (!printed_full_) {
      draw(false);
      printed_full_ = true;
    }
  } else if (now - last_draw_ >= min_interval_s_) {
    draw(false);
  }
}

void ProgressBar::finish(const std::vector<std::pair<std::string, std::string>>& fields) {
  if (finished_) return;
  if (!fields.empty()) fields_ = fields;
  if (tty_) {
    draw(true);
    out_ << '\n' << std::flush;
  } else if (!printed_full_ || !fields.empty()) {
    draw(true);
  }
  finished_ = true;
}

bool is_terminal(FILE* f) { return f != nullptr && ::isatty(::fileno(f)) == 1; }

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "-";
  char buf[48];
  if (seconds < 0.9995) {
    std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1000);
    return buf;
  }
  if (seconds < 59.95) {
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
    return buf;
  }
  return clock_str(seconds);
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 0) return std::string("-").append(format_bytes(bytes == INT64_MIN ? INT64_MAX : -bytes));
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1023.5 && u < 5) v /= 1024, ++u;  // from 1023.5 "%.0f" would print "1024"
  char buf[48];
  std::snprintf(buf, sizeof buf, v < 9.95 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
  return buf;
}

}  // namespace mp::train
