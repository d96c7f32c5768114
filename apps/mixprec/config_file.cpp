// Note [a run described in a file] (commands.hpp): --config FILE.json with command-line flags over it.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "mp/core/error.hpp"

namespace mixprec {

mp::train::TrainConfig resolve_config(const CLI::App* cmd, const mp::train::TrainConfig& flags,
                                      const std::string& path) {
  if (path.empty()) return flags;
  std::ifstream in(path);
  MP_CHECK(in.good(), "--config: cannot read '", path, "'; expected a JSON file of run settings such as `mixprec ",
           cmd->get_name(), " --print_config` writes");
  std::stringstream text;
  text << in.rdbuf();
  mp::train::TrainConfig file;
  try {  // the file's settings, checked field by field (unknown keys and wrong types are refused, naming them)
    file = mp::train::config_from_json(text.str());
  } catch (const mp::Error& e) { MP_FAIL("--config '", path, "': ", e.what()); }
  return mp::train::with_fields(file, flags, given_config_fields(cmd));  // each flag given wins over the file
}

std::set<std::string> given_config_fields(const CLI::App* cmd) {
  std::set<std::string> given;
  mp::train::TrainConfig names;
  mp::train::visit_fields(names, [&](const char* name, auto&, const char*) {
    const CLI::Option* o = cmd->get_option_no_throw(std::string("--") + name);
    if (o != nullptr && o->count() > 0) given.insert(name);
  });
  return given;
}

std::string config_json_pretty(const mp::train::TrainConfig& c) {
  return nlohmann::ordered_json::parse(mp::train::config_to_json(c)).dump(2);
}

}  // namespace mixprec
