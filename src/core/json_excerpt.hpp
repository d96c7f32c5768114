#pragma once
// Note [quoting untrusted JSON]
// nlohmann's dump() and its parser with a callback (which copies values) recurse once per nesting level, so a file
// that nests arrays 100000 deep overflows the stack when a value of it is dumped or it is parsed with a callback
// (found beside the fuzz targets, fuzz/, with inputs larger than theirs). An error message about a file's JSON
// therefore shows a value through json_excerpt, one level deep and at most 80 characters, and a callback refuses deep
// nesting as it begins (read_safetensors_header). Parsing without a callback, comparing with a shallow value and
// destroying are fine: nlohmann does them without deep recursion.
#include <string>

namespace mp {

/// `j` for an error message (Note [quoting untrusted JSON]): a scalar as its JSON text, an array or object as its
/// elements (nested arrays and objects as [...] and {...}), cut at `max_chars` characters.
template <class Json>
std::string json_excerpt(const Json& j, size_t max_chars = 80) {
  if (!j.is_structured()) {
    const std::string s = j.dump();
    return s.size() <= max_chars ? s : s.substr(0, max_chars) + "...";
  }
  std::string s(1, j.is_array() ? '[' : '{');
  for (auto it = j.begin(); it != j.end() && s.size() <= max_chars; ++it) {
    if (it != j.begin()) s.push_back(',');
    if (j.is_object()) s.append(Json(it.key()).dump()).push_back(':');
    s.append(it->is_array() ? "[...]" : it->is_object() ? "{...}" : it->dump());
  }
  s.push_back(j.is_array() ? ']' : '}');
  return s.size() <= max_chars ? s : s.substr(0, max_chars) + "...";
}

}  // namespace mp
