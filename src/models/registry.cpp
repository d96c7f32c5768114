// models::create_image_model: image classifiers by name ("mlp", "mlp-WxL", "resnetN", "wrn-D-K").
#include "mp/models/registry.hpp"

#include <charconv>
#include <optional>

#include "mp/models/mlp.hpp"
#include "mp/models/resnet.hpp"
#include "mp/models/wide_resnet.hpp"

namespace mp::models {

namespace {

const std::vector<int64_t> kResNetDepths{8, 14, 20, 32, 44, 56, 110, 18, 34, 50, 101, 152};

// The decimal number s[pos..end) (digits only, no leading zero), or nullopt.
std::optional<int64_t> parse_int(const std::string& s, size_t pos, size_t end) {
  if (pos >= end || end > s.size() || (s[pos] == '0' && end - pos > 1)) return std::nullopt;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data() + pos, s.data() + end, v);
  if (ec != std::errc() || ptr != s.data() + end) return std::nullopt;
  return v;
}

std::optional<int64_t> resnet_depth(const std::string& name) {
  if (name.rfind("resnet", 0) != 0) return std::nullopt;
  const auto d = parse_int(name, 6, name.size());
  if (!d) return std::nullopt;
  for (int64_t k : kResNetDepths)
    if (k == *d) return d;
  return std::nullopt;
}

// (depth, widen) of "wrn-D-K" with (D-4) % 6 == 0, D >= 10 and K >= 1.
std::optional<std::pair<int64_t, int64_t>> wrn_config(const std::string& name) {
  if (name.rfind("wrn-", 0) != 0) return std::nullopt;
  const size_t dash = name.find('-', 4);
  if (dash == std::string::npos) return std::nullopt;
  const auto d = parse_int(name, 4, dash), k = parse_int(name, dash + 1, name.size());
  if (!d || !k || *d < 10 || (*d - 4) % 6 != 0 || *k < 1) return std::nullopt;
  return std::make_pair(*d, *k);
}

// (width, hidden layers) of "mlp-WxL" with W >= 1 and L >= 1.
std::optional<std::pair<int64_t, int64_t>> mlp_config(const std::string& name) {
  if (name.rfind("mlp-", 0) != 0) return std::nullopt;
  const size_t x = name.find('x', 4);
  if (x == std::string::npos) return std::nullopt;
  const auto w = parse_int(name, 4, x), l = parse_int(name, x + 1, name.size());
  if (!w || !l || *w < 1 || *l < 1) return std::nullopt;
  return std::make_pair(*w, *l);
}

std::string known_list() {
  std::string s;
  for (const std::string& n : image_model_names()) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

}  // namespace

std::vector<std::string> image_model_names() {
  std::vector<std::string> names{"mlp"};
  for (int64_t d : kResNetDepths) names.push_back("resnet" + std::to_string(d));
  for (const char* w : {"wrn-16-4", "wrn-16-8", "wrn-28-10", "wrn-40-4"}) names.emplace_back(w);
  return names;
}

bool is_image_model(const std::string& name) {
  return name == "mlp" || mlp_config(name).has_value() || resnet_depth(name).has_value() ||
         wrn_config(name).has_value();
}

MemoryFormat memory_format_from_flag(const std::string& name, const char* flag) {
  if (name == "channels_last" || name == "nhwc") return MemoryFormat::channels_last;
  if (name == "contiguous" || name == "nchw") return MemoryFormat::contiguous;
  MP_CHECK(name == "auto", "unknown ", flag, " '", name, "'; expected auto, channels_last (nhwc) or contiguous (nchw)");
  return MemoryFormat::channels_last;  // NHWC on the CPU (oneDNN) and on CUDA (cuDNN's tensor cores) alike
}

std::shared_ptr<nn::UnaryModule> create_image_model(const std::string& name, const ImageModelSpec& spec) {
  MP_CHECK(spec.in_channels > 0 && spec.image_size > 0 && spec.num_classes > 0, "create_image_model('", name,
           "'): expected positive in_channels, image_size and num_classes, got ", spec.in_channels, ", ",
           spec.image_size, ", ", spec.num_classes);
  if (name == "mlp")
    return std::make_shared<MLP>(MLPOptions{.in_features = spec.in_channels * spec.image_size * spec.image_size,
                                            .hidden = {512, 512},
                                            .num_classes = spec.num_classes});
  if (auto wl = mlp_config(name))
    return std::make_shared<MLP>(MLPOptions{.in_features = spec.in_channels * spec.image_size * spec.image_size,
                                            .hidden = std::vector<int64_t>(static_cast<size_t>(wl->second), wl->first),
                                            .num_classes = spec.num_classes});
  if (auto d = resnet_depth(name))
    return std::make_shared<ResNet>(ResNetOptions{.depth = *d,
                                                  .in_channels = spec.in_channels,
                                                  .num_classes = spec.num_classes,
                                                  .memory_format = spec.memory_format});
  if (auto wk = wrn_config(name))
    return std::make_shared<WideResNet>(WideResNetOptions{.depth = wk->first,
                                                          .widen = wk->second,
                                                          .in_channels = spec.in_channels,
                                                          .num_classes = spec.num_classes,
                                                          .memory_format = spec.memory_format});
  MP_FAIL("create_image_model: unknown model '", name, "'; known: ", known_list(),
          " (any wrn-D-K with D = 6n+4 >= 10 and K >= 1, and any mlp-WxL with W, L >= 1, works too)");
}

}  // namespace mp::models
