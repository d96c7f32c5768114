// TrainConfig's JSON form (checkpoint metadata "config", --config FILE.json, --print_config), apart from
// validation so that the readers of outside bytes link without the models (the fuzz targets, fuzz/).
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>

#include "core/json_excerpt.hpp"
#include "mp/core/error.hpp"
#include "mp/train/trainer.hpp"

namespace mp::train {
namespace {

/// Whether `j` is a whole number that T holds (2 and 2.0, not 2.5 or 1e300).
template <class T>
bool fits_integer(const nlohmann::json& j) {
  if (j.is_number_float()) {  // T's range as [-2^digits, 2^digits), both bounds exact doubles
    const double d = j.get<double>(), hi = std::ldexp(1.0, std::numeric_limits<T>::digits);
    return d == std::trunc(d) && d < hi && d >= (std::is_signed_v<T> ? -hi : 0.0);
  }
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (!j.is_number_integer()) return false;
  const int64_t v = j.get<int64_t>();
  return v >= 0 ? static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                : std::is_signed_v<T> && v >= static_cast<int64_t>(std::numeric_limits<T>::min());
}

}  // namespace

std::string config_to_json(const TrainConfig& config) {
  TrainConfig c = config;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  visit_fields(c, [&](const char* name, auto& field, const char*) { j[name] = field; });
  return j.dump();
}

TrainConfig config_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) { MP_FAIL("training config: not valid JSON (", e.what(), ")"); }
  MP_CHECK(j.is_object(), "training config: expected a JSON object, got ", j.type_name());
  TrainConfig c;
  std::set<std::string> known;
  visit_fields(c, [&](const char* name, auto& field, const char*) {
    known.insert(name);
    auto it = j.find(name);
    if (it == j.end()) return;
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // nlohmann converts a float to an integer field with a cast: 2.5 would be 2 and 1e300 undefined behaviour.
      MP_CHECK(fits_integer<T>(*it), "training config: field '", name, "' expected an integer from ",
               std::numeric_limits<T>::min(), " to ", std::numeric_limits<T>::max(), ", got ", json_excerpt(*it));
    }
    try {
      field = it->template get<T>();
    } catch (const std::exception& e) {
      MP_FAIL("training config: field '", name, "' has the wrong type (", it->type_name(), "): ", e.what());
    }
  });
  for (auto it = j.begin(); it != j.end(); ++it)
    MP_CHECK(known.count(it.key()) != 0, "training config: unknown field '", it.key(),
             "'; the file may come from a newer mixprec");
  return c;
}

}  // namespace mp::train
