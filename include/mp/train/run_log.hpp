#pragma once
// JSONL run logs: one JSON object per line, one line per training step or epoch, read back by
// `mixprec plot` and by tests.
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace mp::train {

/// A value in a run-log record.
using LogValue = std::variant<int64_t, double, std::string, bool>;

/// A JSONL run log: one JSON object per line (fields in the order given), flushed per record. Opened for
/// append (a resumed run continues the same log) or truncate. Note: JSON has no NaN or infinity, so
/// non-finite doubles are written as null (read_run_log gives NaN back). On append, a torn last line
/// (a crash in the middle of a write) is cut off first, so every line stays a whole record.
/// Not thread-safe: one writer per log.
class RunLog {
 public:
  /// Open `path` (created when absent); throws naming the path and strerror on failure.
  RunLog(const std::string& path, bool append);
  /// Where a resumed run continues: records after it are cut off an appended log.
  struct ResumePoint {
    int64_t global_step = 0;  ///< optimizer steps the checkpoint has done: later "step" records are replayed
    int64_t epochs_done = 0;  ///< whole epochs the checkpoint has done: later "epoch" records are replayed
  };
  /// Open `path` to continue a run resumed from a checkpoint at `from`: the log is appended, and the records
  /// the previous process wrote after that checkpoint (the steps, and maybe an epoch's end, that the resumed
  /// run does again) are cut off first, from the first such record on, so each step and epoch appears once
  /// (Note [a resumed run's log] in run_log.cpp).
  RunLog(const std::string& path, ResumePoint from);
  /// Append one record and flush it to the file.
  void write(const std::vector<std::pair<std::string, LogValue>>& fields);
  /// The file path.
  const std::string& path() const { return path_; }

 private:
  void open(bool append);

  std::string path_;
  std::ofstream out_;
};

/// Read a JSONL run log back (for plots and tests): each line's fields; null -> NaN double, integers ->
/// int64_t, other numbers -> double. Blank lines are skipped, and so is a last line without its newline that
/// does not parse (a record torn by a crash); any other line that is not a JSON object of scalars (string,
/// number, bool, null) is refused naming the file and the line number.
std::vector<std::map<std::string, LogValue>> read_run_log(const std::string& path);

}  // namespace mp::train
