// The autocast policy: its table is MP_AUTOCAST_POLICY (Note [the autocast policy table] in policy.hpp).
#include "mp/autocast/policy.hpp"

namespace mp::amp {

const char* op_name(Op op) {
  switch (op) {
#define MP_AUTOCAST_OP_NAME(o, cpu, cuda) \
  case Op::o: return #o;
    MP_AUTOCAST_POLICY(MP_AUTOCAST_OP_NAME)
#undef MP_AUTOCAST_OP_NAME
    case Op::kCount: break;
  }
  return "?";
}

CastPolicy cast_policy(Op op, DeviceType device) {
  const bool cuda = device == DeviceType::cuda;
  switch (op) {
#define MP_AUTOCAST_OP_POLICY(o, cpu, cuda_class) \
  case Op::o: return cuda ? CastPolicy::cuda_class : CastPolicy::cpu;
    MP_AUTOCAST_POLICY(MP_AUTOCAST_OP_POLICY)
#undef MP_AUTOCAST_OP_POLICY
    case Op::kCount: break;
  }
  return CastPolicy::none;
}

const char* policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::lower: return "lower";
    case CastPolicy::fp32: return "fp32";
    case CastPolicy::promote: return "promote";
    case CastPolicy::none: return "none";
  }
  return "?";
}

}  // namespace mp::amp
