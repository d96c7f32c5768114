// The text of the opt levels and loss scales (flags, configs, labels), apart from initialize() so that the
// readers of outside bytes (the config's JSON, fuzz/) link without the models.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mp/amp/initialize.hpp"

namespace mp::amp {

const char* opt_level_name(OptLevel l) {
  switch (l) {
    case OptLevel::O0: return "O0";
    case OptLevel::O1: return "O1";
    case OptLevel::O2: return "O2";
    case OptLevel::O3: return "O3";
  }
  return "?";
}

OptLevel opt_level_from_string(const std::string& s) {
  std::string t = s;
  if (!t.empty() && (t[0] == 'o' || t[0] == 'O')) t = t.substr(1);
  if (t == "0") return OptLevel::O0;
  if (t == "1") return OptLevel::O1;
  if (t == "2") return OptLevel::O2;
  if (t == "3") return OptLevel::O3;
  MP_FAIL("unknown opt level '", s, "': expected O0, O1, O2 or O3");
}

LossScale LossScale::parse(const std::string& s) {
  if (s == "dynamic") return {Kind::dynamic, 0.0};
  if (s == "none" || s == "off") return {Kind::none, 0.0};
  try {
    size_t pos = 0;
    const double v = std::stod(s, &pos);
    if (pos == s.size() && v > 0 && std::isfinite(v)) return {Kind::fixed, v};
  } catch (...) {}
  MP_FAIL("invalid loss scale '", s, "': expected 'dynamic', 'none' or a positive number such as 128");
}

std::string LossScale::str() const {
  if (kind == Kind::dynamic) return "dynamic";
  if (kind == Kind::none) return "none";
  char buf[32];  // the fewest digits that read back as the value (a config's text must round-trip)
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

}  // namespace mp::amp
