// libFuzzer target: JSON config files (`mixprec train --config FILE.json`) through the CLI's resolve_config
// (apps/mixprec/config_file.cpp); an accepted config must come back unchanged through config_to_json.
#include "../apps/mixprec/commands.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static CLI::App app{"fuzz_config"};
  const std::string path = mp::fuzz::write_temp(data, size, "config.json");
  mp::fuzz::expect_accept_or_refuse(
      path,
      [&] {
        const mp::train::TrainConfig c = mixprec::resolve_config(&app, mp::train::TrainConfig{}, path);
        const std::string json = mp::train::config_to_json(c);
        if (mp::train::config_to_json(mp::train::config_from_json(json)) != json)
          mp::fuzz::finding("an accepted config does not read back unchanged: " + json);
      },
      "--config '" + path + "': ");
  return 0;
}
