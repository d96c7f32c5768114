#pragma once
/// The mixed-precision engine: policy, autocast, loss scaling, opt levels, diagnostics. The policy table and the
/// Autocast guard live below ops/ (mp/autocast/, namespace mp::amp); the rest of amp/ sits above nn/ and optim/.
#include "mp/amp/auto_precision.hpp"
#include "mp/amp/diagnostics.hpp"
#include "mp/amp/grad_scaler.hpp"
#include "mp/amp/initialize.hpp"
#include "mp/amp/telemetry.hpp"
#include "mp/autocast/autocast.hpp"
#include "mp/autocast/policy.hpp"
