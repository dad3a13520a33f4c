// Exit codes that tell a launcher or scheduler why a hyperion process ended, so that its
// restart policy can tell a broken job from a broken machine (launch/restart_policy.h).
#pragma once

namespace hyperion {

// A system failure the job did not cause: a peer rank or its host lost (killed, stopped,
// cut off). `hyperion workload` restarts it from the last checkpoint, up to
// --max-restarts times, as it does a rank killed by a signal.
inline constexpr int kExitSystemFailure = 42;

}  // namespace hyperion
