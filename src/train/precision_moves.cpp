// What a run records of its automatic precision (train/precision_moves.hpp).
#include "train/precision_moves.hpp"

#include <nlohmann/json.hpp>
#include <utility>

#include "mp/core/error.hpp"

namespace mp::train::detail {

std::string precision_state_json(const amp::AutoPrecision& ap, bool observe_next) {
  nlohmann::ordered_json moves = nlohmann::ordered_json::array();
  for (const amp::PrecisionMove& m : ap.moves())
    moves.push_back({{"module", m.module},
                     {"type", m.type},
                     {"from", dtype_name(m.from)},
                     {"to", dtype_name(m.to)},
                     {"step", m.step},
                     {"reason", m.reason}});
  nlohmann::ordered_json streaks = nlohmann::ordered_json::object();
  for (const auto& [module, s] : ap.streaks()) streaks[module] = {s.overflow, s.underflow};
  return nlohmann::ordered_json{{"moves", moves}, {"streaks", streaks}, {"observe_next", observe_next}}.dump();
}

void restore_precision_state(const std::string& json, const std::string& what, amp::AutoPrecision& ap,
                             bool& observe_next) {
  const char* expected =
      "expected {\"moves\": [{\"module\", \"type\", \"from\", \"to\", \"step\", \"reason\"}, ...], \"streaks\": "
      "{module: [overflow, underflow]}, \"observe_next\": bool}";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    MP_FAIL(what, " is not valid JSON (", e.what(), "); the file is damaged: resume from another checkpoint");
  }
  auto bad = [&](const nlohmann::json& got) -> std::string {
    return what + ": " + expected + ", got " + got.dump() + "; the file is damaged: resume from another checkpoint";
  };
  MP_CHECK(j.is_object() && j.contains("moves") && j["moves"].is_array() && j.contains("streaks") &&
               j["streaks"].is_object() && j.contains("observe_next") && j["observe_next"].is_boolean(),
           bad(j));
  std::vector<amp::PrecisionMove> moves;
  for (const nlohmann::json& m : j["moves"]) {
    MP_CHECK(m.is_object() && m.contains("module") && m["module"].is_string() && m.contains("type") &&
                 m["type"].is_string() && m.contains("from") && m["from"].is_string() && m.contains("to") &&
                 m["to"].is_string() && m.contains("step") && m["step"].is_number_integer() && m.contains("reason") &&
                 m["reason"].is_string(),
             bad(m));
    const DType from = dtype_from_string(m["from"].get<std::string>());
    const DType to = dtype_from_string(m["to"].get<std::string>());
    MP_CHECK(is_low_precision(from) && to == DType::f32, what, ": a move from ", dtype_name(from), " to ",
             dtype_name(to), " (expected f16 or bf16 to f32); the file is damaged: resume from another checkpoint");
    moves.push_back({.module = m["module"].get<std::string>(),
                     .type = m["type"].get<std::string>(),
                     .from = from,
                     .to = to,
                     .step = m["step"].get<int64_t>(),
                     .reason = m["reason"].get<std::string>()});
  }
  std::map<std::string, amp::AutoPrecision::Streak> streaks;
  for (const auto& [module, s] : j["streaks"].items()) {
    MP_CHECK(s.is_array() && s.size() == 2 && s[0].is_number_integer() && s[1].is_number_integer() &&
                 s[0].get<int64_t>() >= 0 && s[1].get<int64_t>() >= 0,
             bad(s));
    streaks[module] = {.overflow = s[0].get<int64_t>(), .underflow = s[1].get<int64_t>()};
  }
  ap.restore(std::move(moves), std::move(streaks));
  observe_next = j["observe_next"].get<bool>();
}

std::string move_text(const amp::PrecisionMove& m, const std::vector<std::string>& converted) {
  std::string with;
  for (size_t i = 1; i < converted.size(); ++i) with += (with.empty() ? "" : ", ") + converted[i];
  return "step " + std::to_string(m.step) + ": " + m.module + " (" + m.type + ") " + dtype_name(m.from) + " -> " +
         dtype_name(m.to) + (with.empty() ? "" : " (with " + with + ", which share its weights)") + ": " + m.reason;
}

void write_precision_move(RunLog& log, int64_t epoch, const amp::PrecisionMove& m,
                          const std::vector<std::string>& converted) {
  std::string with;
  for (size_t i = 1; i < converted.size(); ++i) with += (with.empty() ? "" : ",") + converted[i];
  log.write({{"type", std::string("precision")},
             {"epoch", epoch},
             {"step", m.step},
             {"module", m.module},
             {"kind", m.type},
             {"from", std::string(dtype_name(m.from))},
             {"to", std::string(dtype_name(m.to))},
             {"with", with},
             {"reason", m.reason}});
}

}  // namespace mp::train::detail
