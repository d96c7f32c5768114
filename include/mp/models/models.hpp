#pragma once
/// Every model of mp::models: MLP, ResNets, Wide-ResNets, the word LM, GPT (with its sampling) and the image-model
/// registry.
#include "mp/models/gpt.hpp"
#include "mp/models/mlp.hpp"
#include "mp/models/registry.hpp"
#include "mp/models/resnet.hpp"
#include "mp/models/sampling.hpp"
#include "mp/models/wide_resnet.hpp"
#include "mp/models/word_lm.hpp"
