#pragma once
/// Everything of mp::data: datasets, IDX/CIFAR readers, transforms, the threaded loader and text corpora.
#include "mp/data/bpe.hpp"
#include "mp/data/cifar.hpp"
#include "mp/data/dataset.hpp"
#include "mp/data/idx.hpp"
#include "mp/data/loader.hpp"
#include "mp/data/text.hpp"
#include "mp/data/transforms.hpp"
#include "mp/data/utf8_stream.hpp"
