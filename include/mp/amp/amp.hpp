#pragma once
/// The mixed-precision engine: policy, autocast, loss scaling, opt levels, diagnostics.
#include "mp/amp/autocast.hpp"
#include "mp/amp/diagnostics.hpp"
#include "mp/amp/grad_scaler.hpp"
#include "mp/amp/initialize.hpp"
#include "mp/amp/policy.hpp"
#include "mp/amp/telemetry.hpp"
