// JSONL run logs.
#include "mp/train/run_log.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mp/core/error.hpp"

namespace mp::train {
namespace {

using Json = nlohmann::ordered_json;

void cut_at(const std::string& path, int64_t end, const char* why) {
  if (::truncate(path.c_str(), static_cast<off_t>(end)) != 0) {
    const int err = errno;
    MP_FAIL("RunLog: cannot cut ", why, " off '", path, "': ", std::strerror(err), "; check the permissions");
  }
}

/// Cut a last line that has no newline (a record torn by a crash) off an existing log.
void drop_torn_tail(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec || size == 0) return;
  std::ifstream in(path, std::ios::binary);
  MP_CHECK(in.good(), "RunLog: cannot read '", path, "': ", std::strerror(errno), "; check the path and permissions");
  int64_t end = size;  // bytes to keep
  char last = 0;
  in.seekg(size - 1);
  in.get(last);
  if (last == '\n') return;
  constexpr int64_t kChunk = 4096;
  std::string buf;
  bool found = false;
  while (end > 0 && !found) {
    const int64_t start = std::max<int64_t>(0, end - kChunk);
    buf.resize(static_cast<size_t>(end - start));
    in.seekg(start);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    MP_CHECK(in.good(), "RunLog: cannot read '", path, "'; check the file");
    const size_t nl = buf.rfind('\n');
    if (nl != std::string::npos) {
      end = start + static_cast<int64_t>(nl) + 1;
      found = true;
    } else {
      end = start;
    }
  }
  in.close();
  cut_at(path, end, "the torn last record");
}

// Note [a resumed run's log]
// A run killed after its last checkpoint has logged steps (and perhaps an epoch's end) that the resumed run
// does again. Appending would list those steps twice, with a jump back in the loss curve (TensorBoard calls
// such events orphaned and purges them). So a resumed log is cut at its first record past the checkpoint: a
// "step" (or "numerics") record whose step exceeds the checkpoint's global step, or an "epoch" record whose epoch
// (1-based) exceeds the epochs it had finished. The file is chronological, so everything after that record is a replay
// too. Records of other kinds are kept.
void drop_replayed_records(const std::string& path, RunLog::ResumePoint from) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  MP_CHECK(in.good(), "RunLog: cannot read '", path, "': ", std::strerror(errno), "; check the path and permissions");
  std::string line;
  int64_t offset = 0;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      const auto type = j.find("type");
      auto past = [&](const char* key, int64_t limit) {
        const auto v = j.find(key);
        return v != j.end() && v->is_number_integer() && v->get<int64_t>() > limit;
      };
      if (type != j.end() && type->is_string() &&
          (((*type == "step" || *type == "numerics") && past("step", from.global_step)) ||
           (*type == "epoch" && past("epoch", from.epochs_done)))) {
        in.close();
        return cut_at(path, offset, "the records written after the checkpoint");
      }
    }
    offset += static_cast<int64_t>(line.size()) + 1;
  }
}

}  // namespace

RunLog::RunLog(const std::string& path, bool append) : path_(path) {
  MP_CHECK(!path.empty(), "RunLog: expected a file path, got an empty string");
  if (append) drop_torn_tail(path);
  open(append);
}

RunLog::RunLog(const std::string& path, ResumePoint from) : path_(path) {
  MP_CHECK(!path.empty(), "RunLog: expected a file path, got an empty string");
  drop_torn_tail(path);
  drop_replayed_records(path, from);
  open(/*append=*/true);
}

void RunLog::open(bool append) {
  out_.open(path_, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  if (!out_) {
    const int err = errno;
    MP_FAIL("RunLog: cannot open '", path_, "' for ", append ? "appending" : "writing", ": ", std::strerror(err),
            "; check that the folder exists and is writable");
  }
}

void RunLog::write(const std::vector<std::pair<std::string, LogValue>>& fields) {
  Json rec = Json::object();
  for (const auto& field : fields) {
    const std::string& key = field.first;  // not a structured binding: clang 14 cannot capture one (fuzz/)
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, double>) {
            if (std::isfinite(v))
              rec[key] = v;
            else
              rec[key] = nullptr;  // JSON has no NaN/inf
          } else {
            rec[key] = v;
          }
        },
        field.second);
  }
  const std::string line = rec.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  out_.write(line.data(), static_cast<std::streamsize>(line.size()));
  out_.flush();
  if (!out_) {
    const int err = errno;
    MP_FAIL("RunLog::write: writing '", path_, "' failed: ", std::strerror(err), "; check the free disk space");
  }
}

std::vector<std::map<std::string, LogValue>> read_run_log(const std::string& path) {
  std::error_code ec;
  MP_CHECK(!std::filesystem::is_directory(path, ec), "read_run_log: '", path,
           "' is a folder; expected a .jsonl run log");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    MP_FAIL("read_run_log: cannot open '", path, "': ", std::strerror(err), "; check the path");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::map<std::string, LogValue>> records;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    ++line_no;
    size_t nl = text.find('\n', pos);
    const bool complete = nl != std::string::npos;
    if (!complete) nl = text.size();
    const std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() && !complete) break;  // a record torn by a crash
    MP_CHECK(!j.is_discarded() && j.is_object(), "read_run_log: '", path, "' line ", line_no,
             ": expected a JSON object, got '", line.substr(0, 80), line.size() > 80 ? "...'" : "'",
             "; the file is not a mixprec run log");
    std::map<std::string, LogValue> rec;
    for (const auto& [key, v] : j.items()) {
      if (v.is_null())
        rec[key] = std::numeric_limits<double>::quiet_NaN();
      else if (v.is_boolean())
        rec[key] = v.get<bool>();
      else if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        rec[key] = static_cast<double>(v.get<uint64_t>());
      else if (v.is_number_integer())
        rec[key] = v.get<int64_t>();
      else if (v.is_number())
        rec[key] = v.get<double>();
      else if (v.is_string())
        rec[key] = v.get<std::string>();
      else
        MP_FAIL("read_run_log: '", path, "' line ", line_no, ": field '", key, "' is a JSON ", v.type_name(),
                "; expected a string, number, bool or null");
    }
    records.push_back(std::move(rec));
  }
  return records;
}

}  // namespace mp::train
