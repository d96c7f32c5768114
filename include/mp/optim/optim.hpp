#pragma once
/// Optimizers and learning-rate schedules.
#include "mp/optim/adam.hpp"
#include "mp/optim/clip_grad.hpp"
#include "mp/optim/ema.hpp"
#include "mp/optim/lr_scheduler.hpp"
#include "mp/optim/optimizer.hpp"
#include "mp/optim/sgd.hpp"
