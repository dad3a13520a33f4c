// What happens to an exception nothing catches: one thrown inside an OpenMP region or a
// std::thread (whose functions cannot let it pass) ends the process through
// std::terminate. The handler turns running out of memory there into the same named
// error, exit 1, that main gives it, rather than an abort and a core dump; any other
// uncaught exception is named ("internal error") and still aborts, as a bug should.
#pragma once

namespace hyperion {

// The out-of-memory line, the same from main's catch and from the handler.
inline constexpr const char* kOutOfMemoryMessage =
    "hyperion: error: out of memory (an allocation failed; reduce the model, batch or "
    "context size)\n";

void install_terminate_handler();

}  // namespace hyperion
