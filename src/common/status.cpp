#include "moe_ep/status.h"

namespace moe_ep {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kCapacity:
      return "capacity";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kDestroyed:
      return "destroyed";
    case ErrorCode::kPeer:
      return "peer";
    case ErrorCode::kBackend:
      return "backend";
    case ErrorCode::kState:
      return "state";
  }
  return "unknown";
}

}  // namespace moe_ep
