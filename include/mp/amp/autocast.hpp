#pragma once
// Kept so that user code including this path still compiles: the header moved to mp/autocast/autocast.hpp
// (below ops/; docs/DESIGN.md 2.1). Library code includes that one.
#include "mp/autocast/autocast.hpp"
