#pragma once
/// The public face of mixprec: everything a training program needs.
#include "mp/autograd/gradcheck.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/cpu_features.hpp"
#include "mp/core/device.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/error.hpp"
#include "mp/core/half.hpp"
#include "mp/core/philox.hpp"
#include "mp/memory/allocator.hpp"
#include "mp/ops/ops.hpp"
#include "mp/tensor/tensor.hpp"
