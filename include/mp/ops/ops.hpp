#pragma once
/// All functional ops.
#include "mp/ops/attention.hpp"
#include "mp/ops/conv.hpp"
#include "mp/ops/embedding.hpp"
#include "mp/ops/linalg.hpp"
#include "mp/ops/loss.hpp"
#include "mp/ops/norm.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"
#include "mp/ops/rnn.hpp"
#include "mp/ops/rnn_library.hpp"
#include "mp/ops/shape.hpp"
#include "mp/ops/softmax.hpp"
