#include "common/error.h"

namespace switchboard {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kDeadlineExceeded: return "DeadlineExceeded";
    case ErrorCode::kUnavailable: return "Unavailable";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
    case ErrorCode::kCancelled: return "Cancelled";
    case ErrorCode::kFailedPrecondition: return "FailedPrecondition";
    case ErrorCode::kRegistry: return "Registry";
    case ErrorCode::kUnauthenticated: return "Unauthenticated";
    case ErrorCode::kPermissionDenied: return "PermissionDenied";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

}  // namespace switchboard
