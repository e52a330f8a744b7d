// Errors of the public API. Every failure is a moe_ep::Error whose message names the offending
// value and the limit it broke; the code lets bindings map it to their own exception types.
#pragma once

#include <stdexcept>
#include <string>

namespace moe_ep {

enum class ErrorCode {
  kInvalidArgument,  // bad dtype, shape, stride, value range, or configuration
  kCapacity,         // more tokens than the workspace serves
  kUnsupported,      // a configuration this build or device cannot run
  kDestroyed,        // a call after destroy()
  kPeer,             // a peer rank failed or never arrived (timeout); names the rank and stage
  kBackend,          // CUDA / NCCL / system failure
  kState,            // call not valid in the layer's mode (e.g. forward on do_finalize=false)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace moe_ep
