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

// A typed field from its text (also a JSON bool for a true/false field; null: unset).
template <class T>
void read_text_field(T& field, const nlohmann::json& j, const char* name) {
  if (j.is_null()) {
    field = T{};
    return;
  }
  if constexpr (std::is_same_v<T, std::optional<bool>>) {
    if (j.is_boolean()) {
      field = j.get<bool>();
      return;
    }
  }
  MP_CHECK(j.is_string(), "training config: field '", name, "' expected a string, got ", json_excerpt(j));
  try {
    field = FieldText<T>::parse(j.get<std::string>(), name);
  } catch (const Error& e) { MP_FAIL("training config: ", e.what()); }
}

}  // namespace

DType FieldText<DType>::parse(const std::string& s, const char* name) {
  if (s == "fp32") return DType::f32;
  if (s == "fp16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  MP_FAIL("unknown --", name, " '", s, "': expected fp32, fp16 or bf16");
}
std::string FieldText<DType>::format(DType v) {
  MP_CHECK(v == DType::f32 || v == DType::f16 || v == DType::bf16, "a run's precision is fp32, fp16 or bf16, got ",
           dtype_name(v));
  return v == DType::f32 ? "fp32" : v == DType::f16 ? "fp16" : "bf16";
}

std::optional<amp::OptLevel> FieldText<std::optional<amp::OptLevel>>::parse(const std::string& s, const char* name) {
  if (s.empty()) return std::nullopt;
  try {
    return amp::opt_level_from_string(s);
  } catch (const Error&) {
    MP_FAIL("unknown --", name, " '", s, "': expected O0, O1, O2 or O3 (or leave it out for the precision's default)");
  }
}
std::string FieldText<std::optional<amp::OptLevel>>::format(const std::optional<amp::OptLevel>& v) {
  return v ? amp::opt_level_name(*v) : "";
}

std::optional<amp::LossScale> FieldText<std::optional<amp::LossScale>>::parse(const std::string& s, const char* name) {
  if (s.empty()) return std::nullopt;
  try {
    return amp::LossScale::parse(s);
  } catch (const Error&) {
    MP_FAIL("invalid --", name, " '", s,
            "': expected dynamic, none or a positive number such as 128 (or leave it out for the opt level's default)");
  }
}
std::string FieldText<std::optional<amp::LossScale>>::format(const std::optional<amp::LossScale>& v) {
  return v ? v->str() : "";
}

std::optional<bool> FieldText<std::optional<bool>>::parse(const std::string& s, const char* name) {
  if (s.empty()) return std::nullopt;
  if (s == "true") return true;
  if (s == "false") return false;
  MP_FAIL("--", name, " must be true or false, got '", s, "' (leave it out for the opt level's default)");
}
std::string FieldText<std::optional<bool>>::format(const std::optional<bool>& v) {
  return v ? (*v ? "true" : "false") : "";
}

std::string config_to_json(const TrainConfig& config) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  visit_fields(config, [&](const char* name, const auto& field, const char*) {
    using T = std::remove_cvref_t<decltype(field)>;
    if constexpr (TextField<T>)
      j[name] = FieldText<T>::format(field);  // Note [one table of settings]
    else
      j[name] = field;
  });
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
    if constexpr (TextField<T>) {
      read_text_field(field, *it, name);
    } else {
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
    }
  });
  for (auto it = j.begin(); it != j.end(); ++it)
    MP_CHECK(known.count(it.key()) != 0, "training config: unknown field '", it.key(),
             "'; the file may come from a newer mixprec");
  return c;
}

TrainConfig with_fields(const TrainConfig& base, const TrainConfig& values, const std::set<std::string>& given) {
  TrainConfig c = base;
  size_t found = 0;
  visit_fields(c, [&](const char* name, auto& field, const char*) {
    if (given.count(name) == 0) return;
    ++found;
    visit_fields(values, [&](const char* n, const auto& v, const char*) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, std::remove_cvref_t<decltype(field)>>)
        if (std::string(n) == name) field = v;
    });
  });
  MP_CHECK(found == given.size(), "with_fields: a name in the set is not a TrainConfig field");
  return c;
}

}  // namespace mp::train
