// TrainConfig's JSON form (config_json.cpp): what --config files and checkpoints hold, read back field by field.
#include <gtest/gtest.h>

#include "mp/train/trainer.hpp"
#include "test_util.hpp"

using mp::test::expect_error;
using mp::train::config_from_json;
using mp::train::config_to_json;
using mp::train::TrainConfig;

TEST(ConfigJson, RoundTrip) {
  TrainConfig c;
  c.epochs = 7;
  c.lr = 0.25;
  c.seed = 18446744073709551615ull;
  c.precision = mp::DType::bf16;
  const std::string json = config_to_json(c);
  EXPECT_EQ(config_to_json(config_from_json(json)), json);
  EXPECT_EQ(config_from_json(json).seed, 18446744073709551615ull);
}

// An integer field takes whole numbers in its range only (found by fuzz/fuzz_config: nlohmann casts a float to the
// field's type, so 2.5 epochs were 2 and 1e300 was undefined behaviour).
TEST(ConfigJson, IntegerFieldsRefuseFloatsAndOutOfRangeNumbers) {
  expect_error([] { config_from_json(R"({"epochs": 2.5})"); },
               {"field 'epochs' expected an integer from -9223372036854775808 to 9223372036854775807", "got 2.5"});
  expect_error([] { config_from_json(R"({"epochs": 1e300})"); }, {"field 'epochs'", "got 1e+300"});
  expect_error([] { config_from_json(R"({"epochs": 9223372036854775808})"); }, {"field 'epochs'"});
  expect_error([] { config_from_json(R"({"num_workers": 4294967296})"); },
               {"field 'num_workers' expected an integer from -2147483648 to 2147483647", "got 4294967296"});
  expect_error([] { config_from_json(R"({"seed": -1})"); },
               {"field 'seed' expected an integer from 0 to 18446744073709551615", "got -1"});
  EXPECT_EQ(config_from_json(R"({"epochs": 3, "num_workers": -2147483648})").num_workers, -2147483648);
  // A value nested a million arrays deep is quoted one level deep (Note [quoting untrusted JSON]; a 2 MB input,
  // beyond the fuzz targets' 4 KB: dumping it whole overflowed the stack).
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  expect_error([&] { config_from_json(R"({"epochs": )" + deep + "}"); }, {"field 'epochs'", "got [[...]]"});
  expect_error([] { config_from_json(R"({"epochs": "three"})"); },
               {"field 'epochs' expected an integer", R"(got "three")"});
  EXPECT_EQ(config_from_json(R"({"epochs": 2.0, "seed": 1.8446744073709550e19})").epochs, 2);
  expect_error([] { config_from_json(R"({"seed": 1.8446744073709552e19})"); }, {"field 'seed'"});  // 2^64
  // Floating fields take integers too.
  EXPECT_EQ(config_from_json(R"({"lr": 1})").lr, 1.0);
}
